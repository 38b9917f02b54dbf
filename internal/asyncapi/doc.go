// Package asyncapi writes the AsyncAPI 3.0 contract of the topics a
// projection file consumes: a channel per topic, the messages each
// projection reads with their Avro reader schemas and Kafka bindings (the
// record key, the schema id in the Confluent wire format's payload
// prefix), the tombstone that deletes a row, the CloudEvents and trace
// headers, and a receive operation per projection in its consumer group.
//
// It owns the document's form only: it must not read the registry, the
// projection file or anything else; its caller hands it the projections
// and their reader schemas. Its output is stable (the same input writes
// the same bytes), so that a committed document diffs cleanly.
package asyncapi
