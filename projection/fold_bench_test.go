package projection_test

import (
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/bench"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
)

// BenchmarkFoldNewAggregate folds an aggregate's first event, as a batch
// does for every aggregate it has not seen (most of them on a stream with
// many more aggregates than events per batch).
func BenchmarkFoldNewAggregate(b *testing.B) {
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		b.Fatal(err)
	}
	p := ps[0]
	ev := projection.Event{Key: "acc-0000001", Version: 1, Type: "AccountOpened",
		Fields: map[string]any{"owner": "ann", "occurred_at": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.FoldOwned(nil, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFoldDeposit folds a deposit into a row the caller owns, as a
// batch does for an aggregate's later events.
func BenchmarkFoldDeposit(b *testing.B) {
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		b.Fatal(err)
	}
	p := ps[0]
	row, err := p.FoldOwned(nil, projection.Event{Key: "acc-0000001", Version: 1, Type: "AccountOpened",
		Fields: map[string]any{"owner": "ann", "occurred_at": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}})
	if err != nil {
		b.Fatal(err)
	}
	ev := projection.NewEvent("acc-0000001", 2, "Deposited", []string{"account_id", "amount", "type", "version"}, []any{"acc-0000001", int64(420), "Deposited", int64(2)})
	b.ReportAllocs()
	for b.Loop() {
		if row, err = p.FoldOwned(row, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotFold folds an aggregate's next event into the snapshot
// projection `projector bench` runs: "owned" rebuilds the row in place as
// a batch does (FoldOwned), "new row" builds a fresh map per event as Fold
// must.
func BenchmarkSnapshotFold(b *testing.B) {
	ps, err := bench.Projections(bench.ModeEngineSnapshot, "t")
	if err != nil {
		b.Fatal(err)
	}
	p := ps[0]
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := projection.NewEvent("acc-0000001", 2, "Deposited", []string{"account_id", "amount", "occurred_at", "type"},
		[]any{"acc-0000001", int64(420), at, "Deposited"})
	for _, owned := range []bool{true, false} {
		name := "owned"
		if !owned {
			name = "new row"
		}
		b.Run(name, func(b *testing.B) {
			row, err := p.Apply(nil, ev)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if owned {
					row, err = p.FoldOwned(row, ev)
				} else {
					row, err = p.Apply(row, ev)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
