package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/demo"
)

// check compares a run's tables with the reference fold of what it
// consumed.
func (b *bench) check(ctx context.Context, pool *pgxpool.Pool, mode string, ds *dataset, res *WorkerResult) error {
	switch mode {
	case ModeLimit, ModeLimitKeyed:
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM limit_rows`).Scan(&n); err != nil {
			return err
		}
		if n != int64(ds.events) {
			return fmt.Errorf("limit_rows holds %d rows, want %d", n, ds.events)
		}
		return nil
	case ModeEngineFold:
		if err := demo.Verify(ctx, pool, demo.Table, ds.exp); err != nil {
			return err
		}
		return checkEngineTables(ctx, pool)
	case ModeRebuild:
		return verifyRebuilt(ctx, pool, ds.exp)
	case ModeEngineSnapshot:
		if err := verifySnapshot(ctx, pool, ds.records); err != nil {
			return err
		}
		return checkEngineTables(ctx, pool)
	case ModeUpsert:
		// The peer has no gap handling, so it may legitimately differ:
		// how much is a result, not a failure of the run.
		diffs, err := snapshotDiffs(ctx, pool, ds.records)
		if err != nil {
			return err
		}
		if len(diffs) > 0 {
			return &mismatches{table: SnapshotTable, diffs: diffs}
		}
		return nil
	case ModeNaive, ModeWatermill:
		committed, err := processedPrefix(ctx, pool, ds.topic)
		if err != nil {
			return err
		}
		var n int64
		for p, c := range committed {
			n += c
			if c != res.Committed[p] {
				return fmt.Errorf("partition %d: processed_events holds offsets 0..%d, the consumer counted %d", p, c-1, res.Committed[p])
			}
		}
		if n != res.Events {
			return fmt.Errorf("processed_events holds %d events, the consumer counted %d", n, res.Events)
		}
		var prefix []demo.Record
		for i, r := range ds.records {
			if ds.offOf[i] < committed[ds.partOf[i]] {
				prefix = append(prefix, r)
			}
		}
		return demo.Verify(ctx, pool, demo.Table, demo.Fold(prefix))
	}
	return nil
}

// checkEngineTables checks that the engine parked and dead-lettered
// nothing: the stream has no gaps and no poison.
func checkEngineTables(ctx context.Context, pool *pgxpool.Pool) error {
	var parked, dead int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_parked), (SELECT count(*) FROM projector_dead_letters)`).Scan(&parked, &dead); err != nil {
		return err
	}
	if parked != 0 || dead != 0 {
		return fmt.Errorf("%d parked events and %d dead letters, want none", parked, dead)
	}
	return nil
}

// processedPrefix reads, per partition, how many events processed_events
// holds, and checks that they are exactly offsets 0..n-1.
func processedPrefix(ctx context.Context, pool *pgxpool.Pool, topic string) (map[int32]int64, error) {
	rows, err := pool.Query(ctx, `SELECT partition, count(*), min("offset"), max("offset") FROM processed_events WHERE topic = $1 GROUP BY partition`, topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var (
			p             int32
			n, minO, maxO int64
		)
		if err := rows.Scan(&p, &n, &minO, &maxO); err != nil {
			return nil, err
		}
		if minO != 0 || maxO != n-1 {
			return nil, fmt.Errorf("partition %d: processed_events holds %d offsets from %d to %d, not a prefix", p, n, minO, maxO)
		}
		out[p] = n
	}
	return out, rows.Err()
}

// mismatches is a table that differs from the reference fold: diffs
// holds one line per account that differs.
type mismatches struct {
	table string
	diffs []string
}

func (m *mismatches) Error() string {
	shown := m.diffs
	if len(shown) > 10 {
		shown = shown[:10]
	}
	return fmt.Sprintf("%s differs from the last event of its account for %d accounts:\n  %s", m.table, len(m.diffs), strings.Join(shown, "\n  "))
}

// verifySnapshot checks the snapshot projection: every account's row holds
// its last event.
func verifySnapshot(ctx context.Context, pool *pgxpool.Pool, records []demo.Record) error {
	diffs, err := snapshotDiffs(ctx, pool, records)
	if err != nil {
		return err
	}
	if len(diffs) > 0 {
		return &mismatches{table: SnapshotTable, diffs: diffs}
	}
	return nil
}

// snapshotDiffs compares the snapshot table with the last event of every
// account in records: one line, sorted, per account whose row differs or
// is missing, or per row of no account.
func snapshotDiffs(ctx context.Context, pool *pgxpool.Pool, records []demo.Record) ([]string, error) {
	want := map[string]demo.Event{}
	for _, r := range records {
		if r.Event.Version > want[r.Key].Version {
			want[r.Key] = r.Event
		}
	}
	rows, err := pool.Query(ctx, `SELECT account_id, kind, amount, occurred_at, version FROM `+SnapshotTable)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var diffs []string
	seen := make(map[string]bool, len(want))
	for rows.Next() {
		var (
			id, kind        string
			amount, version int64
			at              time.Time
		)
		if err := rows.Scan(&id, &kind, &amount, &at, &version); err != nil {
			return nil, err
		}
		seen[id] = true
		w, ok := want[id]
		if !ok || kind != w.Type || amount != w.Amount || version != w.Version || !at.Equal(w.OccurredAt) {
			diffs = append(diffs, fmt.Sprintf("%s: got %s/%d/%s v%d, want %s/%d/%s v%d", id, kind, amount, at.UTC().Format(time.RFC3339Nano), version,
				w.Type, w.Amount, w.OccurredAt.Format(time.RFC3339Nano), w.Version))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for id, w := range want {
		if !seen[id] {
			diffs = append(diffs, fmt.Sprintf("%s: no row, want %s/%d/%s v%d", id, w.Type, w.Amount, w.OccurredAt.Format(time.RFC3339Nano), w.Version))
		}
	}
	slices.Sort(diffs)
	return diffs, nil
}
