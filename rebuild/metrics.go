package rebuild

import (
	"math"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a deployment's rebuild and generation metrics.
type Metrics struct {
	ratio     *prometheus.GaugeVec
	remaining *prometheus.GaugeVec
	eta       *prometheus.GaugeVec
	info      *prometheus.GaugeVec

	mu   sync.Mutex
	seen map[[3]string]bool // info series set, to remove those gone
}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ratio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_rebuild_progress_ratio",
			Help: "Share of a rebuild's records applied: done / (done + still to reach the log end).",
		}, []string{"projection", "generation"}),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_rebuild_records_remaining",
			Help: "Records a rebuild still has to apply to reach the log end.",
		}, []string{"projection", "generation"}),
		eta: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_rebuild_eta_seconds",
			Help: "Estimated seconds until a rebuild reaches the log end: remaining / (rebuild rate - arrival rate); +Inf while arrivals are as fast.",
		}, []string{"projection", "generation"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_projection_generation_info",
			Help: "1 for each generation of a projection that exists, labelled with its state (building, live, retired).",
		}, []string{"projection", "generation", "state"}),
		seen: map[[3]string]bool{},
	}
	if reg != nil {
		reg.MustRegister(m.ratio, m.remaining, m.eta, m.info)
	}
	return m
}

// operations sets the progress series of the operations in flight from
// what their rows hold (the replica holding each one's row stores it).
func (m *Metrics) operations(ops []Operation) {
	if m == nil {
		return
	}
	for _, op := range ops {
		if op.RecordsRemaining == nil {
			continue
		}
		l := prometheus.Labels{"projection": op.Projection, "generation": strconv.Itoa(op.Generation)}
		remaining := *op.RecordsRemaining
		if total := op.RecordsDone + remaining; total > 0 {
			m.ratio.With(l).Set(float64(op.RecordsDone) / float64(total))
		} else {
			m.ratio.With(l).Set(1)
		}
		m.remaining.With(l).Set(float64(remaining))
		if op.ETASeconds != nil {
			m.eta.With(l).Set(*op.ETASeconds)
		} else {
			m.eta.With(l).Set(math.Inf(1))
		}
	}
}

// generations sets the info series of gs, and removes the progress of
// generations no longer being built.
func (m *Metrics) generations(gs []Generation) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := map[[3]string]bool{}
	for _, g := range gs {
		k := [3]string{g.Projection, strconv.Itoa(g.N), g.State}
		now[k] = true
		m.info.WithLabelValues(k[:]...).Set(1)
		if g.State != Building {
			l := prometheus.Labels{"projection": k[0], "generation": k[1]}
			m.ratio.Delete(l)
			m.remaining.Delete(l)
			m.eta.Delete(l)
		}
	}
	for k := range m.seen {
		if !now[k] {
			m.info.DeleteLabelValues(k[:]...)
		}
	}
	m.seen = now
}
