package projector_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestRebalancesWhileBatchesAreOpen adds and removes members while records
// flow, so partitions move with batches in flight; the table must still
// equal the reference fold and nothing may be stored twice.
func TestRebalancesWhileBatchesAreOpen(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 3000, 11
	b := faultSetup(t, opts, 6).bundle

	cfg := func(reg prometheus.Registerer) projector.Config {
		return projector.Config{
			Partition:      partition.Config{BatchMaxRecords: 50, BatchMaxWait: 20 * time.Millisecond},
			SessionTimeout: 6 * time.Second,
			Registerer:     reg,
		}
	}
	regs := map[string]*prometheus.Registry{}
	stops := map[string]func(){}
	start := func(name string) {
		regs[name] = prometheus.NewRegistry()
		stops[name] = run(t, b.engine(t, "rebalance", cfg(regs[name])))
	}
	chunk := len(b.records) / 5
	produce := func(i int) {
		t.Helper()
		part := b.records[i*chunk : min((i+1)*chunk, len(b.records))]
		if i == 4 {
			part = b.records[i*chunk:]
		}
		b.produce(t, part)
	}
	steps := []func(){
		func() { start("a") },
		func() { start("b") },
		func() { start("c") },
		func() { stops["a"]() },
		func() { stops["b"](); start("d") },
	}
	for i, step := range steps {
		produce(i)
		step()
	}
	b.verify(t, "rebalance")

	var revoked float64
	for _, reg := range regs {
		revoked += counter(t, reg, "projector_partitions_revoked_total")
	}
	if revoked == 0 {
		t.Errorf("no partition was ever revoked: the test did not rebalance")
	}
}

// TestFencedOwnerStops claims the partitions behind a running member's
// back, as a newer owner would: the member's next commits are fenced and
// counted, its workers stop, and a later member finishes the stream from
// the stored offsets without applying anything twice.
func TestFencedOwnerStops(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 500
	b := setup(t, opts, 3)

	reg := prometheus.NewRegistry()
	// A batch waits a second for more records: long enough to claim the
	// partitions underneath it.
	e := b.engine(t, "fence", projector.Config{
		Partition:  partition.Config{BatchMaxRecords: 1_000_000, BatchMaxWait: time.Second},
		Registerer: reg,
	})
	stop := run(t, e)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := len(e.Workers()); n < 3 {
			return fmt.Errorf("the member runs %d workers, want 3", n)
		}
		return nil
	})
	offsets := postgres.NewOffsets(b.db.Pool, "fence")
	tps := []sinks.TP{{Topic: b.kafka.Topic, Partition: 0}, {Topic: b.kafka.Topic, Partition: 1}, {Topic: b.kafka.Topic, Partition: 2}}
	if _, err := offsets.Claim(ctx, tps); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := len(e.Workers()); n > 0 {
			return fmt.Errorf("fenced workers did not stop: %d still run", n)
		}
		return nil
	})
	if got := counter(t, reg, "projector_fenced_batches_total"); got != 3 {
		t.Errorf("fenced batches: got %v, want 3", got)
	}
	var rows int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("a fenced batch wrote %d rows", rows)
	}
	stop()

	run(t, b.engine(t, "fence", projector.Config{}))
	b.verify(t, "fence")
}

// metrics returns the samples of the family name gathered from g.
func metrics(t *testing.T, g prometheus.Gatherer, name string) []*dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// counter sums every sample of a counter or gauge family, or counts the
// observations of a histogram family.
func counter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metrics(t, g, name) {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return sum
}

// histogramSum sums the observed values of a histogram family.
func histogramSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metrics(t, g, name) {
		sum += m.GetHistogram().GetSampleSum()
	}
	return sum
}

// bucket returns the observations of a histogram family at most le.
func bucket(t *testing.T, g prometheus.Gatherer, name string, le float64) float64 {
	t.Helper()
	var n float64
	for _, m := range metrics(t, g, name) {
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() == le {
				n += float64(b.GetCumulativeCount())
			}
		}
	}
	return n
}
