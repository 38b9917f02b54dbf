package projector_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

// TestCountersExistFromTheStart runs a member on an empty topic: before
// anything happened, every counter a dashboard or alert takes rate() of
// has its series at 0 for the label values the member knows (its
// projections and its partitions), so that a fresh member looks like a
// healthy one and the first increment is a change rate() sees.
func TestCountersExistFromTheStart(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 10
	f := faultSetup(t, opts, 2)
	reg := prometheus.NewRegistry()
	run(t, f.engine(t, "fresh", projector.Config{Registerer: reg}))

	series := func() map[string]float64 {
		out := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				out[seriesName(mf.GetName(), m)] = value(m)
			}
		}
		return out
	}
	testenv.WaitFor(t, time.Minute, func() error {
		if n := series()[`projector_partitions_assigned{group="fresh"}`]; n != 2 {
			return fmt.Errorf("%v partitions assigned, want 2", n)
		}
		return nil
	})
	have := series()
	var want []string
	topic := f.kafka.Topic
	for _, p := range f.projs {
		for _, o := range []string{"applied", "stale", "parked", "dead_lettered"} {
			want = append(want, fmt.Sprintf(`projector_records_processed_total{group="fresh",outcome=%q,projection=%q,topic=%q}`, o, p.Name, topic))
		}
		for _, c := range sinks.Classes {
			want = append(want, fmt.Sprintf(`projector_dead_letters_total{group="fresh",projection=%q,reason=%q}`, p.Name, c))
		}
		for _, r := range []string{"filled", "repaired", "dead_lettered"} {
			want = append(want, fmt.Sprintf(`projector_gaps_total{group="fresh",projection=%q,resolution=%q}`, p.Name, r))
		}
		for _, r := range []string{"unavailable", "not_found", "failed"} {
			want = append(want, fmt.Sprintf(`projector_gap_repair_failures_total{group="fresh",projection=%q,reason=%q}`, p.Name, r))
		}
	}
	for part := range 2 {
		for _, r := range []string{"postgres", "timeout", "error"} {
			want = append(want, fmt.Sprintf(`projector_retries_total{group="fresh",partition="%d",reason=%q,topic=%q}`, part, r, topic))
		}
		want = append(want, fmt.Sprintf(`projector_records_skipped_total{group="fresh",partition="%d",topic=%q}`, part, topic))
	}
	want = append(want, `projector_transaction_shrinks_total{group="fresh",sqlstate="57014"}`, `projector_rebalances_total{group="fresh"}`)
	// A partition's series come with its worker, which starts just after
	// the partition counts as assigned: wait for them (on an empty topic
	// nothing increments them, so only their creation at 0 shows them).
	testenv.WaitFor(t, 10*time.Second, func() error {
		have = series()
		for _, s := range want {
			if _, ok := have[s]; !ok {
				return fmt.Errorf("%s: no series before its first increment", s)
			}
		}
		return nil
	})
	for _, s := range want {
		v, ok := have[s]
		switch {
		case !ok:
			t.Errorf("%s: no series before its first increment", s)
		case v != 0 && !strings.HasPrefix(s, "projector_rebalances_total"):
			t.Errorf("%s = %v on an empty topic, want 0", s, v)
		}
	}
	if t.Failed() {
		var names []string
		for s := range have {
			names = append(names, s)
		}
		sort.Strings(names)
		t.Logf("series:\n%s", strings.Join(names, "\n"))
	}
}

// seriesName is the series of m in the exposition format, its labels in
// name order.
func seriesName(name string, m *dto.Metric) string {
	var labels []string
	for _, l := range m.GetLabel() {
		labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(labels)
	return name + "{" + strings.Join(labels, ",") + "}"
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}
