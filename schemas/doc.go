// Package schemas converts between Confluent wire-format values and Go
// values through a Schema Registry.
//
// Reading: a Decoder takes a value in the Confluent wire format (magic byte
// 0, a 4-byte big-endian schema id, then Avro binary), fetches the writer
// schema by id from the registry on first sight, resolves it against the
// consumer's reader schema (Avro schema resolution: writer fields the reader
// lacks are skipped, reader fields the writer lacks take their defaults) and
// caches the result per id. Failures are classified: ErrMalformed,
// ErrUnknownSchema, ErrIncompatible and ErrUndecodable are terminal for the
// value (IsTerminal); anything else, such as an unreachable registry, is
// transient and worth retrying.
//
// Writing: AppendWire produces wire-format values and Register registers
// schema texts under a subject, for producers such as the demo and tests.
//
// This package knows nothing about Kafka, Postgres or projections: it turns
// bytes into records and back.
package schemas
