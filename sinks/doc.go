// Package sinks holds the contract between a partition worker and the
// place its projection lands: the partition and its claim, the state a
// sink reads for a batch, the changes a batch writes, the dead letters it
// keeps, and the errors a worker branches on. Each sink lives in a
// subpackage (sinks/postgres) and implements Sink and Offsets, and
// LaneCommitter when it can commit the projections of one topic together;
// every one passes the conformance suite of sinks/sinktest.
//
// It is a leaf: it must not import the worker, a sink, a Kafka client or
// a tracer, so that a sink depends on nothing but its database and this
// contract.
package sinks
