package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// upsertSQL is the upsert peer's one statement per poll: every account's
// newest event of the poll, written over an older row and never over a
// newer one.
const upsertSQL = `INSERT INTO ` + SnapshotTable + ` AS t (account_id, kind, amount, occurred_at, version)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::bigint[])
ON CONFLICT (account_id) DO UPDATE SET kind = EXCLUDED.kind, amount = EXCLUDED.amount,
	occurred_at = EXCLUDED.occurred_at, version = EXCLUDED.version
WHERE t.version < EXCLUDED.version`

// lastEvent is one account's newest event within a poll.
type lastEvent struct {
	kind    string
	amount  int64
	at      time.Time
	version int64
}

// runUpsert is the consumer a competent engineer writes in a day for the
// snapshot table: a franz-go group consumer polls, keeps each account's
// newest event of the poll, writes them in one multi-row upsert guarded by
// version, then commits the poll's offsets to Kafka. It is at least once
// and has no gap handling: an event that arrives after a newer one of its
// account is dropped by the guard, and a version missing from the stream
// goes unnoticed.
func runUpsert(ctx context.Context, e *runEnv) error {
	spec := e.spec
	pool, err := openPool(ctx, spec.DatabaseURL, nil, 0)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	// The table exactly as the engine's snapshot projection creates it,
	// so that both are checked the same way.
	projs, err := Projections(ModeEngineSnapshot, spec.Topic)
	if err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, pool, projs...); err != nil {
		return fmt.Errorf("create %s: %w", SnapshotTable, err)
	}
	reg, err := sr.NewClient(sr.URLs(spec.RegistryURL))
	if err != nil {
		return err
	}
	reader, err := ReaderSchema()
	if err != nil {
		return err
	}
	dec := schemas.NewDecoder(reg, schemas.Prune(reader, projs[0].ReadFields())) // the engine's decoder, as the engine prunes it
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(spec.Brokers...),
		kgo.ConsumerGroup(spec.Identity),
		kgo.ConsumeTopics(spec.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		// A rebalance waits until the poll's offsets are committed, so
		// that a partition moves on from where its rows were written.
		kgo.BlockRebalanceOnPoll(),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := e.ready(ctx); err != nil {
		return err
	}
	end := <-e.endOffsets()
	res := &WorkerResult{}
	next := map[int32]int64{}
	reached := func() bool {
		for p, o := range end {
			if next[p] < o {
				return false
			}
		}
		return true
	}
	var doneAt time.Time
	for !reached() {
		// A run that stops moving fails rather than hangs.
		pctx, cancel := context.WithTimeout(ctx, stallAfter)
		fetches := cl.PollFetches(pctx)
		stalled := pctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		if fetches.IsClientClosed() {
			return errors.New("upsert: client closed")
		}
		var ferr error
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && ferr == nil {
				ferr = fmt.Errorf("fetch %s/%d: %w", topic, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		recs := fetches.Records()
		if len(recs) == 0 {
			if !stalled {
				continue
			}
			var sum int64
			for _, o := range next {
				sum += o
			}
			return fmt.Errorf("upsert stalled: %d of %d events committed, none for %s", sum, total(end), stallAfter)
		}
		res.Fetched += int64(len(recs))
		latest := make(map[string]lastEvent, len(recs))
		for _, r := range recs {
			rec, _, err := dec.Decode(ctx, r.Value)
			if err != nil {
				return fmt.Errorf("decode %d/%d: %w", r.Partition, r.Offset, err)
			}
			id, _ := rec["account_id"].(string)
			ev := lastEvent{version: asInt64(rec["version"]), amount: asInt64(rec["amount"])}
			ev.kind, _ = rec["type"].(string)
			ev.at, _ = rec["occurred_at"].(time.Time)
			if old, ok := latest[id]; !ok || ev.version > old.version {
				latest[id] = ev
			}
		}
		ids := make([]string, 0, len(latest))
		kinds := make([]string, 0, len(latest))
		amounts := make([]int64, 0, len(latest))
		ats := make([]time.Time, 0, len(latest))
		versions := make([]int64, 0, len(latest))
		for id, ev := range latest {
			ids, kinds, amounts, ats, versions = append(ids, id), append(kinds, ev.kind), append(amounts, ev.amount), append(ats, ev.at), append(versions, ev.version)
		}
		tag, err := pool.Exec(ctx, upsertSQL, ids, kinds, amounts, ats, versions)
		if err != nil {
			return fmt.Errorf("upsert %d rows: %w", len(ids), err)
		}
		res.RowWrites += tag.RowsAffected()
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			return fmt.Errorf("commit offsets: %w", err)
		}
		doneAt = time.Now()
		cl.AllowRebalance()
		for _, r := range recs {
			if r.Offset+1 > next[r.Partition] {
				next[r.Partition] = r.Offset + 1
			}
		}
	}
	if doneAt.IsZero() {
		doneAt = time.Now()
	}
	e.finish(res, doneAt)
	res.Events = total(end)
	res.Committed = end
	e.report(ctx, res)
	return nil
}

// asInt64 reads an Avro long or int the decoder returned.
func asInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case int:
		return int64(n)
	}
	return 0
}
