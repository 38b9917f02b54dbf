// Package outbox is the producer side of projector: a transactional outbox
// in PostgreSQL and a relay that publishes it to Kafka, keyed by aggregate
// id, in per-aggregate order, with CloudEvents and W3C trace headers.
//
// # Writing
//
// A service writes its events with Append in the transaction that changes
// its own state, so the events exist if and only if that transaction
// commits:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// … the service's own writes …
//		return outbox.Append(ctx, tx, outbox.Event{
//			AggregateType: "account", AggregateID: "acc-42", Version: 7,
//			Type: "Deposited", Topic: "accounts.events",
//			Value: map[string]any{"account_id": "acc-42", "version": 7, "type": "Deposited", "amount": 100, "occurred_at": time.Now()},
//		})
//	})
//
// Value is stored as JSON and encoded at publish time with the latest
// schema registered under "<topic>-value"; Payload is a value already in
// the Confluent wire format (see schemas.AppendWire). One Append is one
// INSERT … SELECT FROM unnest(…), whatever the number of events. The trace
// context of ctx (OpenTelemetry's W3C TraceContext propagator) is stored
// with the rows. Migrate creates the table projector_outbox; a statement
// trigger notifies the channel projector_outbox at commit.
//
// # Publishing
//
// A Relay runs on one dedicated connection (a session) and repeats:
//
//   - Claim: one SELECT (its own short transaction) reads up to BatchSize
//     unpublished rows of the shards it owns, in seq order. It takes no
//     row locks (only a shard's owner reads its rows). It reads each owned
//     shard from the partial index of unpublished rows by (shard, seq) of
//     its shard count and merges them, so it reads about as many rows as
//     it returns however far other shards lag, whatever the table
//     statistics say (the session disables sorts and bitmap scans). The
//     table is created with the index of DefaultShards; a relay with
//     another count, or an outbox from an older version, builds its index
//     with CREATE INDEX CONCURRENTLY in the background and walks the
//     unpublished rows of every shard by seq until it is built.
//   - Publish: it produces them with the idempotent producer
//     (acks from all in-sync replicas) and waits for every acknowledgement.
//     No transaction is open meanwhile; the relay reads its session's
//     connection, so that it hears at once when the session ends.
//   - Mark: one UPDATE sets published_at on the acknowledged rows; per
//     aggregate only the acknowledged prefix (franz-go fails every later
//     record of a partition after a failed one, so in practice that is
//     all acknowledged rows).
//
// It claims again at once after a full batch, else waits for a
// notification (LISTEN on the same session), at most PollInterval. A
// commit is typically published within milliseconds.
//
// # Order and replicas
//
// Aggregates are spread over Shards shards by hash(aggregate_id) % Shards
// (hashtextextended in SQL, so every replica agrees). A relay owns a shard
// while its session holds the advisory lock (namespace, shard), and claims
// and marks only on that session: if the session dies, so do its locks
// and its ability to claim. Every PollInterval each relay counts the
// relays on the outbox (holders of a shared membership lock) and moves
// toward its fair share, ceil(Shards / relays): it releases shards above
// it (between rounds, so nothing of theirs is in flight) and locks free
// ones below it. So replicas share the work and a replica that dies has
// its shards taken over within about one PollInterval. (Simply trying every
// shard would let the first replica keep all of them.) All replicas must
// use the same Shards; while relays with different counts run, none of
// them publishes, and each logs an error, until they agree.
//
// A relay whose session ends while its records are in flight withdraws
// the ones not yet sent (franz-go fails them once no request of theirs is
// on the wire) and ends its round without marking, so the shards' next
// owner, which can lock them only once the session is gone, does not
// publish beside it. Only a produce request already on the wire, or a
// session whose end the relay cannot see (a network partition from
// PostgreSQL before the server ends the session), can still overlap with
// the next owner's records.
//
// Per aggregate the records reach Kafka in version order: a claim starts
// at the aggregate's lowest unpublished row, every row below it was
// acknowledged before it was marked, and one producer keeps a partition's
// order across retries. Even such an overlap can only repeat versions
// from the lowest unpublished one on, never send a new version ahead of
// an older one. This assumes the
// writers append an aggregate's versions in order (each after the previous
// one committed, as optimistic concurrency on the aggregate gives).
//
// Delivery is at least once. A crash (or a lost session) between the
// acknowledgement and the mark publishes that batch again, at most
// BatchSize records, with the same ce_id; the consumer's version gate
// treats the copies as stale.
//
// # Failures
//
// While the broker is unavailable, produce calls are retried (franz-go's
// default: without limit) and the rows wait; nothing is marked that was
// not acknowledged. Records waiting longer than UnreadyAfter are logged
// (once, then once a minute), set projector_outbox_produce_stalled and
// fail Ready's "kafka" check until the broker acknowledges again.
//
// A session that ends (the connection lost, the server restarting) is
// started again on a fresh connection: a pooled connection that fails its
// ping is discarded. After a session that did its work the retry is
// immediate (with jitter); repeated failures back off as RetryBase and
// RetryCap say. Each end counts in
// projector_outbox_session_restarts_total{reason}. A registry failure makes the round retry with
// backoff. A value that cannot be encoded with its topic's schema (or a
// topic without a registered schema) blocks its row (columns error,
// failed_at) and the aggregate's later rows, not the other aggregates;
// it is retried every CleanupInterval, after a schema change for
// instance, and counted in projector_outbox_blocked.
//
// Published rows are deleted after Retention, 10,000 per statement.
//
// # Metrics
//
// projector_outbox_pending and projector_outbox_oldest_pending_seconds
// (the whole table), projector_outbox_blocked,
// projector_outbox_shards_owned, projector_outbox_published_total{topic}
// and projector_outbox_publish_duration_seconds (row insert to broker
// acknowledgement, measured with Postgres's clock up to the claim and the
// relay's after it), projector_outbox_produce_failures_total,
// projector_outbox_produce_stalled and
// projector_outbox_session_restarts_total{reason}.
package outbox
