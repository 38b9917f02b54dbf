// Package postgres is the PostgreSQL sink: it creates the engine's tables
// and each projection's table, writes a batch of rows, parked events and
// dead letters (through package deadletters, which owns them) together
// with the partition's stored offset in one transaction, fences stale
// owners with an owner epoch, and lists what it stored for the CLI. Store
// hands an engine its sinks and offset stores.
//
// It must not consume from Kafka or decide versions: the partition worker
// hands it the changes to write, through the contract of package sinks.
package postgres
