package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SnapshotTable is the table of SnapshotProjections.
const SnapshotTable = "last_event"

// SnapshotProjections is a projection file with a snapshot projection of
// the demo's topic: each event replaces its account's row, AccountClosed
// deletes it. Its rows are the reference fold's Snapshots.
var SnapshotProjections = []byte(`
projections:
  - name: last_event
    topic: ` + Topic + `
    table: ` + SnapshotTable + `
    key: account_id
    mode: snapshot
    type_field: type
    delete_on: [AccountClosed]
    columns:
      account_id: {type: text, primary_key: true}
      kind:       {type: text, field: type}
      owner:      {type: text}
      amount:     {type: bigint}
`)

// VerifySnapshots compares the table of SnapshotProjections with the
// events the reference fold says its rows were last built from, and
// returns a readable list of the differences (at most 10 are spelled out).
func VerifySnapshots(ctx context.Context, pool *pgxpool.Pool, exp Expected) error {
	rows, err := pool.Query(ctx, `SELECT account_id, kind, coalesce(owner, ''), amount, version FROM `+SnapshotTable)
	if err != nil {
		return fmt.Errorf("read %s: %w", SnapshotTable, err)
	}
	defer rows.Close()
	var diffs []string
	seen := map[string]bool{}
	for rows.Next() {
		var (
			id  string
			got Event
		)
		if err := rows.Scan(&id, &got.Type, &got.Owner, &got.Amount, &got.Version); err != nil {
			return fmt.Errorf("read %s: %w", SnapshotTable, err)
		}
		seen[id] = true
		want, ok := exp.Snapshots[id]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%q: unexpected row %s v%d", id, got.Type, got.Version))
		case got.Type != want.Type || got.Owner != want.Owner || got.Amount != want.Amount || got.Version != want.Version:
			diffs = append(diffs, fmt.Sprintf("%q: got %s %q %d v%d, want %s %q %d v%d", id,
				got.Type, got.Owner, got.Amount, got.Version, want.Type, want.Owner, want.Amount, want.Version))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", SnapshotTable, err)
	}
	for id, want := range exp.Snapshots {
		if !seen[id] {
			diffs = append(diffs, fmt.Sprintf("%q: missing, want %s v%d", id, want.Type, want.Version))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	slices.Sort(diffs)
	n := len(diffs)
	return fmt.Errorf("%s differs from the reference fold in %d rows (%d expected, %d found):\n  %s",
		SnapshotTable, n, len(exp.Snapshots), len(seen), strings.Join(diffs[:min(n, 10)], "\n  "))
}
