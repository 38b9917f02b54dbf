package partition

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
)

// benchBatch is one batch as a worker sees it: 1000 records of the demo's
// accounts stream, 200 accounts with 5 consecutive versions each,
// interleaved; half of the accounts already have a row.
type benchBatch struct {
	w     *Worker
	recs  []*kgo.Record
	state sinks.State
}

const benchBatchSize = 1000

// demoCodec registers the demo's schemas in an in-process registry and
// returns the demo's accounts projection, the encoder of its events and a
// decoder of them.
func demoCodec(tb testing.TB) (*projection.Projection, *demo.Encoder, Decoder) {
	tb.Helper()
	reg := srfake.New()
	tb.Cleanup(reg.Close)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		tb.Fatal(err)
	}
	enc, err := demo.RegisterSchemas(tb.Context(), cl)
	if err != nil {
		tb.Fatal(err)
	}
	projs, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		tb.Fatal(err)
	}
	return projs[0], enc, schemas.NewDecoder(cl, enc.ReaderSchema())
}

func newBenchBatch(b *testing.B) *benchBatch {
	b.Helper()
	p, enc, dec := demoCodec(b)
	const accounts, versions = 200, 5
	bb := &benchBatch{state: sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v := 1; v <= versions; v++ {
		for a := 0; a < accounts; a++ {
			id := fmt.Sprintf("acc-%07d", a)
			base := int64(0)
			if a%2 == 0 { // has a row at version 10 already
				base = 10
			}
			ev := demo.Event{AccountID: id, Version: base + int64(v), Type: "Deposited", Amount: int64(a + v), OccurredAt: at}
			if base == 0 && v == 1 {
				ev.Type, ev.Owner = "AccountOpened", "owner "+id
			}
			value, err := enc.Encode(demo.Record{Key: id, Event: ev})
			if err != nil {
				b.Fatal(err)
			}
			bb.recs = append(bb.recs, &kgo.Record{Key: []byte(id), Value: value, Offset: int64(len(bb.recs)), Timestamp: at})
		}
	}
	for a := 0; a < accounts; a += 2 {
		id := fmt.Sprintf("acc-%07d", a)
		bb.state.Rows[id] = projection.Row{"account_id": id, "owner": "owner " + id, "balance": int64(100), "opened_at": at.Format(time.RFC3339Nano)}
		bb.state.Versions[id] = 10
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bb.w = NewWorker(Config{}, WorkerDeps{Group: "bench", Claim: sinks.Claim{TP: sinks.TP{Topic: demo.Topic}}, Projection: p, Decoder: dec, Fetcher: idleFetcher{}, Log: log})
	return bb
}

// idleFetcher is a Fetcher for a worker that is never fed by a client.
type idleFetcher struct{}

func (idleFetcher) PauseFetchPartitions(map[string][]int32) map[string][]int32 { return nil }
func (idleFetcher) ResumeFetchPartitions(map[string][]int32)                   {}

func (bb *benchBatch) items(b *testing.B) []*item {
	items := make([]*item, len(bb.recs))
	for i, r := range bb.recs {
		items[i] = new(item)
		recordItem(items[i], r)
	}
	if err := bb.w.lanes[0].decodeAll(b.Context(), items); err != nil {
		b.Fatal(err)
	}
	return items
}

// perEvent reports time, allocations and bytes per event of the batch.
func perEvent(b *testing.B, events int, f func()) {
	b.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		f()
		n++
	}
	runtime.ReadMemStats(&after)
	total := float64(n * events)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/event")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/total, "allocs/event")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/total, "B/event")
}

// BenchmarkPlan is the plan step of a batch: the version gate and the fold
// of 1000 decoded events into the rows to write.
func BenchmarkPlan(b *testing.B) {
	bb := newBenchBatch(b)
	items := bb.items(b)
	keys := batchKeys(items, func(string) bool { return false }, nil)
	ctx := b.Context()
	ch, out, err := bb.w.lanes[0].plan(ctx, items, keys.All, bb.state, nil, map[string]rejection{}, false)
	if err != nil || out.applied != benchBatchSize || len(ch.Upserts) != 200 {
		b.Fatalf("plan: %v, %d applied, %d upserts", err, out.applied, len(ch.Upserts))
	}
	b.ReportAllocs()
	perEvent(b, benchBatchSize, func() {
		if _, _, err := bb.w.lanes[0].plan(ctx, items, keys.All, bb.state, nil, map[string]rejection{}, false); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkDecodeItems is the decode step of a batch: records to items,
// decoded through the registry-backed decoder (schema cached).
func BenchmarkDecodeItems(b *testing.B) {
	bb := newBenchBatch(b)
	bb.items(b) // warm the schema cache
	b.ReportAllocs()
	perEvent(b, benchBatchSize, func() { bb.items(b) })
}

// BenchmarkBatchGoSide is everything a worker does in Go for one batch
// besides Postgres: records to items, decode, the batch's keys, plan.
func BenchmarkBatchGoSide(b *testing.B) {
	bb := newBenchBatch(b)
	bb.items(b)
	ctx := b.Context()
	b.ReportAllocs()
	perEvent(b, benchBatchSize, func() {
		items := bb.items(b)
		keys := batchKeys(items, func(string) bool { return false }, nil)
		if _, _, err := bb.w.lanes[0].plan(ctx, items, keys.All, bb.state, nil, map[string]rejection{}, false); err != nil {
			b.Fatal(err)
		}
	})
}

// stateSink is a Sink that plans each batch on a fixed state and writes
// nothing: what a worker does for a batch besides Postgres.
type stateSink struct{ st sinks.State }

func (s stateSink) CommitBatch(_ context.Context, _ sinks.Claim, _ int64, _ sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	_, err := plan(s.st)
	return err
}

func (stateSink) Parked(context.Context, sinks.TP) (map[string]sinks.ParkedInfo, error) {
	return nil, nil
}

func (s stateSink) Load(context.Context, sinks.TP, []string) (sinks.State, error) { return s.st, nil }

// BenchmarkProcess is a batch applied on its own as a worker that is not
// behind applies it: records to items, decode, keys, the plan inside the
// sink's transaction, and the worker moving past it (metrics, storm
// guard), the sink writing nothing.
func BenchmarkProcess(b *testing.B) {
	bb := newBenchBatch(b)
	w := NewWorker(Config{}, WorkerDeps{Group: "bench", Claim: sinks.Claim{TP: sinks.TP{Topic: demo.Topic}}, Projection: bb.w.lanes[0].proj,
		Sink: stateSink{bb.state}, Decoder: bb.w.lanes[0].dec, Fetcher: idleFetcher{}, Log: slog.New(slog.DiscardHandler)})
	ctx := b.Context()
	run := func() {
		w.claim.NextOffset = 0
		if err := w.process(ctx, bb.recs); err != nil {
			b.Fatal(err)
		}
	}
	run() // warm the schema cache
	b.ReportAllocs()
	perEvent(b, benchBatchSize, run)
}
