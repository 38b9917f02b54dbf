package rebuild

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// TestStartChecksARepairedDefinition starts rebuilds with definitions
// whose gaps are repaired, which carry no repair source of their own: one
// naming another table is refused like any other, the right one accepted.
func TestStartChecksARepairedDefinition(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	store := NewStore(db.Pool)
	if _, err := store.Ensure(ctx, "app", []*projection.Projection{parse(t, itemsFile)}); err != nil {
		t.Fatal(err)
	}
	repaired := func(table string) *projection.Definition {
		file := strings.Replace(itemsFile, "    mode: snapshot\n", "    mode: snapshot\n    on_gap: repair\n    repair: {http: {url: \"http://source/{key}\"}}\n", 1)
		file = strings.Replace(file, "table: items", "table: "+table, 1)
		def, err := parse(t, file).Definition()
		if err != nil {
			t.Fatal(err)
		}
		return &def
	}
	_, err := store.Start(ctx, Request{Identity: "app", Projection: "items", Definition: repaired("other")})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBadDefinition || !strings.Contains(e.Message, "other") {
		t.Fatalf("a repaired definition naming another table: %v, want %s", err, CodeBadDefinition)
	}
	op, err := store.Start(ctx, Request{Identity: "app", Projection: "items", Definition: repaired("items")})
	if err != nil || op.State != StateAccepted {
		t.Fatalf("a repaired definition of the same table: %+v, %v", op, err)
	}
}

// TestProgressMetricsFromTheOperation sets the progress series from an
// operation's stored progress, as every replica does: 300 done and 100 to
// go at 50 a second with 10 arriving is 75% done, 2.5s away; arrivals as
// fast as the rebuild never converge.
func TestProgressMetricsFromTheOperation(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	remaining, rate, arrivals := int64(100), 50.0, 10.0
	op := Operation{ID: "x", Projection: "items", Generation: 2, State: StateRunning,
		RecordsDone: 300, RecordsRemaining: &remaining, Rate: &rate, ArrivalRate: &arrivals}
	op.fillETA()
	m.operations([]Operation{op})
	l := prometheus.Labels{"projection": "items", "generation": "2"}
	if got := gauge(t, m.ratio.With(l)); got != 0.75 {
		t.Errorf("progress ratio %v, want 0.75", got)
	}
	if got := gauge(t, m.remaining.With(l)); got != 100 {
		t.Errorf("records remaining %v, want 100", got)
	}
	if got := gauge(t, m.eta.With(l)); got != 2.5 {
		t.Errorf("eta %v, want 2.5", got)
	}
	arrivals = 50
	op.ETASeconds, op.Converging = nil, nil
	op.fillETA()
	m.operations([]Operation{op})
	if got := gauge(t, m.eta.With(l)); !math.IsInf(got, 1) || *op.Converging {
		t.Errorf("eta %v (converging %v) with arrivals as fast as the rebuild, want +Inf, not converging", got, *op.Converging)
	}
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
