// Package projector is the engine: it joins the consumer group of one
// consumer identity, claims assigned partitions in the offset store it is
// handed (fencing older owners), starts one partition worker per assigned
// partition and stops it on revocation or loss, and serves metrics and
// health over HTTP.
//
// It must not decide versions or write rows itself, nor pick its sink:
// workers (package partition) decide, and the sinks its Config.Store makes
// (package sinks/postgres for Postgres) write.
package projector
