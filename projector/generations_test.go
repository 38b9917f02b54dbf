package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestEnginesShareARegistry runs two engines of different consumer
// identities side by side in one process, on one metrics registry, each
// projecting the same topic into its own table — what a rebuild does
// beside the live generation. Both tables end equal to the reference
// fold, and each engine's metrics carry its own group.
func TestEnginesShareARegistry(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	b := setup(t, opts, 3)
	live := b.projs
	shadow := make([]*projection.Projection, len(live))
	for i, p := range live {
		c := *p
		c.Table = p.Table + "_g2"
		shadow[i] = &c
	}
	if err := postgres.Migrate(t.Context(), b.db.Pool, shadow...); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	run(t, b.engine(t, "gen1", projector.Config{Registerer: reg}))
	b.projs = shadow
	run(t, b.engine(t, "gen2", projector.Config{Registerer: reg}))
	b.projs = live

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	exp := demo.Fold(b.records)
	for _, g := range []struct{ identity, table string }{{"gen1", demo.Table}, {"gen2", demo.Table + "_g2"}} {
		if err := demo.WaitCommitted(ctx, b.db.Pool, g.identity, b.kafka.Topic, b.end, nil); err != nil {
			t.Fatal(err)
		}
		if err := demo.Verify(ctx, b.db.Pool, g.table, exp); err != nil {
			t.Fatalf("%s: %v", g.identity, err)
		}
		checkCounts(t, b.db.Pool, g.identity, exp)
	}
	applied := map[string]float64{}
	for _, m := range metrics(t, reg, "projector_records_processed_total") {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["outcome"] == "applied" && labels["projection"] == live[0].Name {
			applied[labels["group"]] += m.GetCounter().GetValue()
		}
	}
	if applied["gen1"] == 0 || applied["gen1"] != applied["gen2"] {
		t.Errorf("records applied by group: %v; want the same, above 0, for gen1 and gen2", applied)
	}
}
