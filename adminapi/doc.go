// Package adminapi serves the admin API under /admin/v1/: dead letters
// (list, show, redrive, purge), rebuild operations and offset resets, for
// principals with the admin scope (auth.ScopeAdmin), beside the read API
// on its port with its authenticator, errors, metrics and access log.
// docs/api.md describes the routes.
//
// It must not act without writing the action's audit row in the
// transaction of its effect, nor take the actor from anything a request
// carries but its authenticated subject, nor talk to Kafka itself: offset
// resets, which need the brokers, go through an OffsetResetter.
package adminapi
