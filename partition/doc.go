// Package partition runs one worker per assigned topic-partition: it
// batches the records the poll loop hands it, decodes them, gates each
// aggregate's versions through package versioning, folds them into rows,
// and commits each batch through a Sink together with the partition's
// next offset. Transient failures retry the batch with exponential
// backoff and full jitter; records that can never apply become dead
// letters in the same transaction.
//
// It must not join consumer groups or talk to Postgres directly: the
// engine owns the Kafka client, the sink owns the database.
package partition
