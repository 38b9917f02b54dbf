// Package projector is the engine: it joins the consumer group of one
// consumer identity, claims assigned partitions in Postgres (fencing older
// owners), starts one partition worker per assigned partition and stops it
// on revocation or loss, and serves metrics and health over HTTP.
//
// It must not decide versions or write rows itself: workers (package
// partition) and sinks (package sinks/postgres) do.
package projector
