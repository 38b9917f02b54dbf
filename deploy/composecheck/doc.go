// Package composecheck holds the tests of the local stack's files:
// docker-compose.yml loads as Docker Compose loads it (with compose-go, the
// library of `docker compose config`), every file it mounts exists, and the
// files its services read (collector, Grafana provisioning, Prometheus scrape
// configuration, schema registration script) agree with it. It is a module
// of its own so that the projector module does not carry compose-go's
// dependencies.
package composecheck
