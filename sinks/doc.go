// Package sinks groups the places projections land. Each sink lives in a
// subpackage (sinks/postgres) and implements partition.Sink.
package sinks
