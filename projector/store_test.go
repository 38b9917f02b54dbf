package projector_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/memsink"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

// The engine runs on whatever store it is handed: on the in-memory one it
// folds the stream into the rows the reference fold computes, parks what
// waits for a missing version and dead-letters every poison pill once.
func TestEngineRunsOnAnyStore(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 500
	b := setup(t, opts, 3)
	store := memsink.New(nil)
	run(t, b.engine(t, "mem", projector.Config{Store: store}))
	testenv.WaitFor(t, 2*time.Minute, func() error {
		for p, end := range b.end {
			if next, _ := store.NextOffset("mem", sinks.TP{Topic: demo.Topic, Partition: p}); next < end {
				return fmt.Errorf("partition %d committed up to %d of %d", p, next, end)
			}
		}
		return nil
	})
	exp := demo.Fold(b.records)
	rows, versions := store.Rows(demo.Table)
	var diffs []string
	for id, want := range exp.Accounts {
		r, ok := rows[id]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s: missing, want %+v", id, want))
			continue
		}
		got := demo.Account{Version: versions[id]}
		got.Owner, _ = r["owner"].(string)
		got.Balance = toInt64(r["balance"])
		got.OpenedAt = toTime(t, r["opened_at"])
		if got.Owner != want.Owner || got.Balance != want.Balance || got.Version != want.Version || !got.OpenedAt.Equal(want.OpenedAt) {
			diffs = append(diffs, fmt.Sprintf("%s: got %+v, want %+v", id, got, want))
		}
	}
	for id := range rows {
		if _, ok := exp.Accounts[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: unexpected row %v", id, rows[id]))
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		t.Fatalf("%d rows differ from the reference fold:\n  %s", len(diffs), strings.Join(diffs[:min(10, len(diffs))], "\n  "))
	}
	if parked := store.ParkedCount("mem"); parked != exp.Parked {
		t.Errorf("parked events: got %d, want %d", parked, exp.Parked)
	}
	if dead := len(store.DeadLetters()); dead != exp.Poison {
		t.Errorf("dead letters: got %d, want %d (every poison pill exactly once)", dead, exp.Poison)
	}
}

// toTime reads a timestamptz column as the fold left it: a time, or the
// text Postgres would parse.
func toTime(t *testing.T, v any) time.Time {
	switch at := v.(type) {
	case time.Time:
		return at.UTC()
	case string:
		parsed, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			t.Errorf("opened_at %q: %v", at, err)
		}
		return parsed.UTC()
	}
	return time.Time{}
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case int32:
		return int64(n)
	case float64:
		return int64(n)
	}
	return 0
}
