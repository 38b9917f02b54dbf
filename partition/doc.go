// Package partition runs one worker per assigned topic-partition: it
// batches the records the poll loop hands it, decodes them, gates each
// aggregate's versions through package versioning, folds them into rows,
// and commits each batch through a Sink together with the partition's
// next offset. Transient failures retry the batch with exponential
// backoff and full jitter; records that can never apply become dead
// letters in the same transaction.
//
// The files follow one record's path, one stage each:
//
//   - intake.go: Push, the buffer, pausing and resuming the partition's
//     fetching, taking the next batch (and rewinding to apply one again);
//   - decode.go: a record becomes an item with its aggregate key, version
//     and fields;
//   - plan.go: the batch's aggregates, and the plan that gates and folds
//     each item into the changes a transaction writes;
//   - commit.go: retrying a batch's transaction, and moving the worker
//     and its lanes past it once committed (where Config.Committed is
//     called);
//   - window.go: a worker that is behind plans several batches into one
//     transaction, committed while it plans the next;
//   - lanes.go: the lanes, one per projection the topic feeds (its
//     decoder, gates, parked events, storm guard and sink; a topic of one
//     projection is a worker of one lane), and the path of a batch taken
//     while the worker is not behind: decoded once per reader schema,
//     planned through each lane, every lane committed in one transaction
//     with the partition's offset;
//   - retry.go and refused.go: backing off between attempts, and halting
//     a partition whose statements Postgres refuses;
//   - shrink.go: committing smaller transactions after one met a limit
//     Postgres sets on statements or transactions (statement_timeout);
//   - storm.go: halting a partition, rather than committing, when most of
//     its recent records would be dead letters of one class;
//     deadletterlog.go: the rate-limited log lines of its dead letters.
//
// worker.go holds the worker's lifecycle and the loop that drives the
// stages; config.go its settings; repair.go gap repair; trace.go the
// batch's spans.
//
// It must not join consumer groups or talk to Postgres directly: the
// engine owns the Kafka client, the sink owns the database.
package partition
