package partition

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// recordingSink plans every batch on the state of an empty table and keeps
// what the plan would write.
type recordingSink struct{ batches []sinks.Changes }

func (s *recordingSink) CommitBatch(_ context.Context, _ sinks.Claim, _ int64, _ sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	ch, err := plan(sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}})
	if err != nil {
		return err
	}
	s.batches = append(s.batches, ch)
	return nil
}

func (s *recordingSink) Peek(context.Context, sinks.Claim, sinks.Keys) (sinks.State, error) {
	return sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}, nil
}
func (s *recordingSink) Parked(context.Context, sinks.TP) (map[string]sinks.ParkedInfo, error) {
	return nil, nil
}
func (s *recordingSink) Load(context.Context, sinks.TP, []string) (sinks.State, error) {
	return sinks.State{}, nil
}

// A hot aggregate's events in one batch, arriving out of order and with
// duplicates among other aggregates' events, are folded into one row
// write at its last version, equal to folding them in order.
func TestHotAggregateCollapsesToOneRowWrite(t *testing.T) {
	p, enc, dec := demoCodec(t)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	add := func(ev demo.Event) {
		ev.OccurredAt = at
		value, err := enc.Encode(demo.Record{Key: ev.AccountID, Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: demo.Topic, Key: []byte(ev.AccountID), Value: value, Offset: int64(len(recs)), Timestamp: at})
	}
	event := func(id string, v int64) demo.Event {
		if v == 1 {
			return demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "owner " + id}
		}
		return demo.Event{AccountID: id, Version: v, Type: "Deposited", Amount: v}
	}

	const hotVersions, others = 1000, 20
	var want int64 // the hot account's balance: the deposits of v2..v1000
	dups, early := 0, 0
	for v := int64(1); v <= hotVersions; v++ {
		want += event("hot", v).Amount
		switch {
		case v%10 == 9: // v+1 arrives first: v+1 waits for v
			add(event("hot", v+1))
			add(event("hot", v))
			v++
			early++
			want += event("hot", v).Amount
		default:
			add(event("hot", v))
		}
		if v%7 == 0 { // a producer retry: the same event again
			add(event("hot", v))
			dups++
		}
		if v%50 == 0 && v/50 <= others {
			id := "cold-" + string(rune('a'+v/50-1))
			add(event(id, 1))
			add(event(id, 2))
		}
	}

	sink := &recordingSink{}
	reg := prometheus.NewRegistry()
	w := NewWorker(Config{}, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: demo.Topic}}, Projection: p, Sink: sink, Decoder: dec,
		Fetcher: idleFetcher{}, Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(reg, nil)})
	w.lanes[0].gaps.aggs = map[string]*gap{}
	if err := w.process(t.Context(), recs); err != nil {
		t.Fatal(err)
	}

	if len(sink.batches) != 1 {
		t.Fatalf("%d batches committed for %d records, want 1", len(sink.batches), len(recs))
	}
	ch := sink.batches[0]
	if len(ch.Park) != 0 || len(ch.DeadLetters) != 0 || len(ch.Deletes) != 0 {
		t.Errorf("batch parks %d, dead-letters %d, deletes %d events; want none", len(ch.Park), len(ch.DeadLetters), len(ch.Deletes))
	}
	writes := map[string]sinks.RowWrite{}
	for _, u := range ch.Upserts {
		if _, twice := writes[u.Key]; twice {
			t.Errorf("%s written twice in one batch", u.Key)
		}
		writes[u.Key] = u
	}
	if len(writes) != 1+others {
		t.Errorf("%d row writes for %d records of %d aggregates, want one per aggregate", len(ch.Upserts), len(recs), 1+others)
	}
	hot := writes["hot"]
	if hot.Version != hotVersions || hot.Row["balance"] != want || hot.Row["owner"] != "owner hot" {
		t.Errorf("hot row v%d %v, want v%d with balance %d and owner %q", hot.Version, hot.Row, hotVersions, want, "owner hot")
	}
	for k, u := range writes {
		if k != "hot" && (u.Version != 2 || u.Row["balance"] != int64(2)) {
			t.Errorf("%s row v%d %v, want v2 with balance 2", k, u.Version, u.Row)
		}
	}
	count := func(outcome string) float64 {
		var m dto.Metric
		if err := w.metrics.processed.WithLabelValues(p.Name, demo.Topic, outcome).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	// Outcomes on arrival: an event ahead of its predecessor parks first.
	applied, parked, stale := count("applied"), count("parked"), count("stale")
	if applied != float64(hotVersions+2*others-early) || parked != float64(early) || stale != float64(dups) {
		t.Errorf("applied %v, parked %v, stale %v; want %d applied, %d parked on arrival and the %d duplicates stale",
			applied, parked, stale, hotVersions+2*others-early, early, dups)
	}
}
