package partition

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/memsink"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// countingDecoder counts the records it decodes.
type countingDecoder struct {
	ValuesDecoder
	n atomic.Int64
}

func (c *countingDecoder) Decode(ctx context.Context, value []byte) (map[string]any, int, error) {
	c.n.Add(1)
	return c.ValuesDecoder.Decode(ctx, value)
}

func (c *countingDecoder) DecodeValues(ctx context.Context, value []byte, vals []any) ([]string, map[string]any, int, error) {
	c.n.Add(1)
	return c.ValuesDecoder.DecodeValues(ctx, value, vals)
}

// A topic feeding a fold and a snapshot projection: a worker applies
// every record to both, decoding it once when they share their reader
// schema (their decoder) and once per projection when they do not, and
// both tables hold what each projection's fold makes of the stream, when
// it commits batch by batch and when, behind, it commits several batches
// in one transaction.
func TestLanesDecodeOncePerReader(t *testing.T) {
	for _, tc := range []struct {
		shared     bool
		maxBatches int
	}{{true, 1}, {false, 1}, {true, 0}, {false, 0}} {
		shared := tc.shared
		p, enc, dec := demoCodec(t)
		snaps, err := projection.Parse(demo.SnapshotProjections, ".")
		if err != nil {
			t.Fatal(err)
		}
		snap := snaps[0]
		first := &countingDecoder{ValuesDecoder: dec.(ValuesDecoder)}
		second := first
		if !shared {
			_, _, other := demoCodec(t)
			second = &countingDecoder{ValuesDecoder: other.(ValuesDecoder)}
		}
		store := memsink.New(nil)
		tp := sinks.TP{Topic: demo.Topic}
		cs, err := store.Offsets("g").Claim(t.Context(), []sinks.TP{tp})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Offsets("g").InitAll(t.Context(), cs, []int64{0}); err != nil {
			t.Fatal(err)
		}
		sinkOf := func(p *projection.Projection) sinks.Sink {
			s, err := store.Sink(sinks.Target{Identity: "g", Projection: p})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		const accounts, versions = 10, 6
		events := accountEvents(accounts, 1, versions)
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		recs := make([]*kgo.Record, 0, len(events)+1)
		for i, ev := range events {
			ev.OccurredAt = at
			value, err := enc.Encode(demo.Record{Key: ev.AccountID, Event: ev})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Topic: demo.Topic, Key: []byte(ev.AccountID), Value: value, Offset: int64(i), Timestamp: at})
		}
		// A tombstone deletes acc-00's row in both tables.
		recs = append(recs, &kgo.Record{Topic: demo.Topic, Key: []byte("acc-00"), Offset: int64(len(events)), Timestamp: at})
		f := &rewindFetcher{recs: recs}
		reg := prometheus.NewRegistry()
		w := NewWorker(Config{BatchMaxRecords: 7, BatchMaxWait: time.Millisecond, CommitMaxBatches: tc.maxBatches}, WorkerDeps{
			Group: "g", Claim: sinks.Claim{TP: tp, Epoch: cs[0].Epoch}, Projection: p, Sink: sinkOf(p), Decoder: first,
			Others:  []Lane{{Projection: snap, Sink: sinkOf(snap), Decoder: second}},
			Fetcher: f, Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(reg, nil),
		})
		f.w = w
		w.Push(recs, int64(len(recs)))
		stop := runWorker(t, w)
		waitStored(t, w, len(recs))
		stop()

		var transactions, batches uint64
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "projector_commit_batches" {
				h := mf.GetMetric()[0].GetHistogram()
				transactions, batches = h.GetSampleCount(), uint64(h.GetSampleSum())
			}
		}
		if several := transactions < batches; several != (tc.maxBatches != 1) {
			t.Errorf("%+v: %d transactions for %d batches", tc, transactions, batches)
		}
		decodes := first.n.Load()
		if !shared {
			decodes += second.n.Load()
		}
		want := int64(len(events))
		if !shared {
			want *= 2
		}
		if decodes != want {
			t.Errorf("%+v: %d decodes of %d records, want %d", tc, decodes, len(events), want)
		}
		rows, vs := store.Rows(p.Table)
		snapRows, snapVs := store.Rows(snap.Table)
		if _, ok := rows["acc-00"]; ok {
			t.Errorf("fold table: acc-00 has a row after its tombstone")
		}
		if _, ok := snapRows["acc-00"]; ok {
			t.Errorf("snapshot table: acc-00 has a row after its tombstone")
		}
		for a := 1; a < accounts; a++ {
			id := fmt.Sprintf("acc-%02d", a)
			var balance int64
			for v := int64(2); v <= versions; v++ {
				balance += v
			}
			if vs[id] != versions || rows[id]["balance"] != balance {
				t.Errorf("fold table: %s v%d %v, want v%d balance %d", id, vs[id], rows[id], versions, balance)
			}
			if snapVs[id] != versions || snapRows[id]["amount"] != int64(versions) || snapRows[id]["kind"] != "Deposited" {
				t.Errorf("snapshot table: %s v%d %v, want v%d with the last deposit", id, snapVs[id], snapRows[id], versions)
			}
		}
	}
}

// rejectingSink refuses the row of reject in the first transaction, as
// Postgres refusing a value its column cannot hold, then plans as
// recordingSink.
type rejectingSink struct {
	recordingSink
	reject   string
	rejected bool
}

func (s *rejectingSink) CommitBatch(ctx context.Context, c sinks.Claim, end int64, keys sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	if !s.rejected {
		s.rejected = true
		return &sinks.RejectedRows{Keys: map[string]string{s.reject: "value too long for type character varying(8)"}}
	}
	return s.recordingSink.CommitBatch(ctx, c, end, keys, plan)
}

// A topic of one projection is a worker of one lane, and takes the path
// of several: rows Postgres refuses dead-letter their aggregate's events
// and the rest commits, and the warning names the projection whose rows
// they are, as it does where a topic feeds several.
func TestRefusedRowsNameTheirProjection(t *testing.T) {
	p, enc, dec := demoCodec(t)
	var recs []*kgo.Record
	for _, id := range []string{"acc-1", "acc-2"} {
		value, err := enc.Encode(demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "owner " + id}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: demo.Topic, Key: []byte(id), Value: value, Offset: int64(len(recs))})
	}
	var out bytes.Buffer
	sink := &rejectingSink{reject: "acc-2"}
	w := NewWorker(Config{}, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: demo.Topic}}, Projection: p, Sink: sink, Decoder: dec,
		Fetcher: idleFetcher{}, Log: slog.New(slog.NewJSONHandler(&out, nil)), Metrics: NewMetrics(prometheus.NewRegistry(), nil)})
	if err := w.process(t.Context(), recs); err != nil {
		t.Fatal(err)
	}
	if len(sink.batches) != 1 {
		t.Fatalf("%d batches committed, want 1", len(sink.batches))
	}
	ch := sink.batches[0]
	if len(ch.Upserts) != 1 || ch.Upserts[0].Key != "acc-1" {
		t.Errorf("rows written %+v, want acc-1's only", ch.Upserts)
	}
	if len(ch.DeadLetters) != 1 || ch.DeadLetters[0].Offset != 1 || ch.DeadLetters[0].Class != sinks.ClassRejected {
		t.Errorf("dead letters %+v, want acc-2's event as %s", ch.DeadLetters, sinks.ClassRejected)
	}
	found := false
	for line := range bytes.Lines(out.Bytes()) {
		var l struct{ Msg, Projection string }
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(l.Msg, "postgres refused rows") {
			found = true
			if l.Projection != p.Name {
				t.Errorf("refused rows logged with projection %q, want %q: %s", l.Projection, p.Name, line)
			}
		}
	}
	if !found {
		t.Errorf("no line says Postgres refused rows; the log:\n%s", out.String())
	}
}
