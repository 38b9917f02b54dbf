package deadletters

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/sinks"
)

const (
	// writeSQL stores dead letters. A replayed record that failed
	// again ($15 names the entry it replays) reopens this projection's
	// entry of the same original record, with one more attempt, instead
	// of adding one: the replayed entry itself, or, on a topic feeding
	// several projections, this projection's entry of that record (the
	// replayed entry found by its id alone, see resolvedSQL: planned on
	// few dead letters, a join read all of them for every batch once they
	// had grown). Otherwise, and when there is no such entry, a new entry
	// is added. With a dead-letter topic configured ($16 not empty) new
	// entries are queued for publishing in the same transaction.
	writeSQL = `WITH u AS (
		SELECT * FROM unnest($5::bigint[], $6::bytea[], $7::bytea[], $8::jsonb[], $9::timestamptz[], $10::text[],
		                     $11::text[], $12::int[], $13::int[], $14::text[], $15::bigint[])
		  AS u(off, rkey, value, headers, ts, err, class, attempts, schema_id, trace_id, replay_of)
	), reopened AS (
		UPDATE projector_dead_letters d
		SET attempts = d.attempts + 1, last_seen = now(), error = r.err, error_class = r.class, status = 'open'
		FROM (SELECT u.off, u.err, u.class, e.tid FROM u
		      CROSS JOIN LATERAL (SELECT t.topic, t.partition, t."offset" AS orig FROM projector_dead_letters t
		                          WHERE t.id = u.replay_of LIMIT 1) t
		      CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM projector_dead_letters x
		                          WHERE x.identity = $1 AND x.topic = t.topic AND x.partition = t.partition
		                            AND x."offset" = t.orig AND x.projection = $2 LIMIT 1) e) r
		WHERE d.ctid = r.tid AND d.status <> 'purged'
		RETURNING r.off
	), dl AS (
		INSERT INTO projector_dead_letters AS d
		(identity, projection, topic, partition, "offset", record_key, value, headers, record_time, error,
		 error_class, attempts, schema_id, trace_id)
		SELECT $1, $2, $3, $4, u.off, u.rkey, u.value, u.headers, u.ts, u.err, u.class, u.attempts, u.schema_id, u.trace_id
		FROM u WHERE u.off NOT IN (SELECT off FROM reopened)
		ON CONFLICT (identity, topic, partition, "offset", projection)
		DO UPDATE SET last_seen = now(), attempts = d.attempts + 1, error = excluded.error, error_class = excluded.error_class
		RETURNING d.id)
	INSERT INTO projector_dlq_outbox (dead_letter_id, topic)
	SELECT id, $16 FROM dl WHERE $16 <> ''
	ON CONFLICT (dead_letter_id) DO NOTHING`
	// resolvedSQL, as the reopening above, finds each replayed dead
	// letter by its id alone (LATERAL ... LIMIT 1): with the identity's
	// conditions beside it, Postgres could take the index that starts
	// with the identity and read all of its dead letters. The entry it
	// resolves, found through the key of the record and projection, is
	// this projection's of the replayed entry's original record: the
	// replayed entry itself, or on a topic feeding several projections,
	// this projection's entry of the same record. That entry is found
	// the same way, one row by its unique key (LIMIT 1), and updated by
	// its ctid: as a join, a plan made while the table was small read
	// every dead letter of the identity in each batch.
	resolvedSQL = `UPDATE projector_dead_letters d SET status = 'resolved', resolved_at = now()
		FROM unnest($1::bigint[]) AS r(id)
		CROSS JOIN LATERAL (SELECT t.topic, t.partition, t."offset" AS orig FROM projector_dead_letters t WHERE t.id = r.id LIMIT 1) t
		CROSS JOIN LATERAL (SELECT x.ctid AS tid FROM projector_dead_letters x
		                    WHERE x.identity = $2 AND x.topic = t.topic AND x.partition = t.partition
		                      AND x."offset" = t.orig AND x.projection = $3 LIMIT 1) e
		WHERE d.ctid = e.tid AND d.status NOT IN ('resolved', 'purged')`
)

// QueueWrite queues on b, a batch's transaction, the statement that
// stores the dead letters of one partition of a projection of identity.
// With dlqTopic set, every new one is also queued in the outbox for
// publishing to that topic.
func QueueWrite(b *pgx.Batch, identity, projection string, tp sinks.TP, dls []sinks.DeadLetter, dlqTopic string) {
	n := len(dls)
	if n == 0 {
		return
	}
	var (
		offsets   = make([]int64, n)
		rkeys     = make([][]byte, n)
		values    = make([][]byte, n)
		headers   = make([]string, n)
		times     = make([]*time.Time, n)
		errs      = make([]string, n)
		classes   = make([]string, n)
		attempts  = make([]int32, n)
		schemaIDs = make([]*int32, n)
		traces    = make([]*string, n)
		replays   = make([]*int64, n)
	)
	for i, d := range dls {
		offsets[i], rkeys[i], values[i], errs[i], classes[i] = d.Offset, d.RecordKey, d.Value, Text(d.Err), d.Class
		headers[i], times[i], attempts[i] = HeadersJSON(d.Headers), TimeOrNil(d.Timestamp), int32(max(1, d.Attempts))
		if d.SchemaID > 0 {
			v := int32(d.SchemaID)
			schemaIDs[i] = &v
		}
		if d.TraceID != "" {
			traces[i] = &d.TraceID
		}
		if d.ReplayOf > 0 {
			replays[i] = &d.ReplayOf
		}
	}
	b.Queue(writeSQL, identity, projection, tp.Topic, tp.Partition, offsets, rkeys, values, headers, times, errs,
		classes, attempts, schemaIDs, traces, replays, dlqTopic)
}

// QueueResolved queues on b the statement that marks as resolved the
// dead letters of a projection of identity whose replayed record has now
// applied. A replayed record reaches every projection of its topic: each
// resolves its own entry of that record, if it has one.
func QueueResolved(b *pgx.Batch, identity, projection string, ids []int64) {
	if len(ids) > 0 {
		b.Queue(resolvedSQL, ids, identity, projection)
	}
}

// HeadersJSON is a record's headers as the tables that keep records (dead
// letters, and the sink's parked events) store them: a JSON array, empty
// when there are none.
func HeadersJSON(hs []sinks.Header) string {
	if len(hs) == 0 {
		return "[]"
	}
	for i, h := range hs {
		if strings.IndexByte(h.Key, 0) >= 0 {
			// jsonb cannot hold \u0000 (and JSON encoding makes invalid
			// UTF-8 valid): a key with NUL is kept with U+FFFD in its place.
			hs = slices.Clone(hs)
			for j := i; j < len(hs); j++ {
				hs[j].Key = strings.ReplaceAll(hs[j].Key, "\x00", "\uFFFD")
			}
			break
		}
	}
	b, _ := json.Marshal(hs) // cannot fail: strings and byte slices
	return string(b)
}

// Text is s as a text column holds it: valid UTF-8 (other bytes become
// U+FFFD) without NUL (kept as U+FFFD too). An error message that quotes a
// record's bytes must not make its dead letter one Postgres refuses.
func Text(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// TimeOrNil is a record's timestamp as those tables store it: NULL when
// the record has none.
func TimeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
