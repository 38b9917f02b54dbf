package outbox

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	pending   prometheus.Gauge
	oldest    prometheus.Gauge
	blocked   prometheus.Gauge
	owned     prometheus.Gauge
	published *prometheus.CounterVec
	duration  prometheus.Histogram
	failures  prometheus.Counter
	stalled   prometheus.Gauge
	restarts  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		pending: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_outbox_pending", Help: "Outbox rows not yet published (the whole table, as every relay sees it).",
		})),
		oldest: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_outbox_oldest_pending_seconds", Help: "Age of the oldest outbox row not yet published; 0 when none.",
		})),
		blocked: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_outbox_blocked", Help: "Outbox rows whose value could not be encoded with the topic's schema; each holds back its aggregate's later events.",
		})),
		owned: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_outbox_shards_owned", Help: "Aggregate shards this relay publishes.",
		})),
		published: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_outbox_published_total", Help: "Outbox events acknowledged by the broker, by topic (a crash between acknowledgement and marking counts the republished ones again).",
		}, []string{"topic"})),
		duration: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "projector_outbox_publish_duration_seconds",
			Help:    "From an outbox row's insert to the broker's acknowledgement of its record.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		})),
		failures: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "projector_outbox_produce_failures_total", Help: "Outbox records the Kafka client gave up on (after its own retries); their rows stay unpublished and are retried.",
		})),
		stalled: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_outbox_produce_stalled", Help: "1 while this relay's records have waited longer than its unready-after for the broker's acknowledgement (the broker unreachable or refusing produce requests), else 0.",
		})),
		restarts: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_outbox_session_restarts_total", Help: "Database sessions of this relay that ended and were started again, by reason (connect, connection_lost, no_table, database_error); its shards are released each time.",
		}, []string{"reason"})),
	}
	// Every reason's series exists at 0 from the start, so that rate()
	// has a first sample and a fresh relay looks like a healthy one.
	for _, reason := range []string{"connect", "connection_lost", "no_table", "database_error"} {
		m.restarts.WithLabelValues(reason)
	}
	return m
}

// register registers c, or returns the collector already registered in
// its place (two relays of one process share their metrics).
func register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
