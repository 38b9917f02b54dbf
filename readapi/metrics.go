package readapi

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's request metrics, by route pattern (never the
// raw path, whose keys would make a series each).
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_http_requests_total",
			Help: "HTTP requests the read and admin APIs answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "projector_http_request_duration_seconds",
			Help:    "How long the read and admin APIs took to answer a request, by route pattern, min_version waits included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("readapi: register metrics: %w", err)
			}
		}
	}
	// Each route's series exist from the start, so that a rate over them
	// is not missing until the first request.
	for _, r := range []string{routeRow, routeRows} {
		m.duration.WithLabelValues(r)
		m.requests.WithLabelValues(r, "200")
	}
	return m, nil
}

// route returns the series of route, looked up once rather than by label
// values on every request.
func (m *metrics) route(route string) *routeMetrics {
	return &routeMetrics{
		route:    route,
		requests: m.requests,
		// Made with the route's first request: a route nobody asks for
		// (other, the document) adds no series.
		duration: sync.OnceValue(func() prometheus.Observer { return m.duration.WithLabelValues(route) }),
	}
}

// routeMetrics are one route's series: its duration, and its requests'
// counter of each status answered so far.
type routeMetrics struct {
	route    string
	requests *prometheus.CounterVec
	duration func() prometheus.Observer
	codes    sync.Map // status (int) → prometheus.Counter
}

func (m *routeMetrics) observe(status int, took time.Duration) {
	c, ok := m.codes.Load(status)
	if !ok {
		c, _ = m.codes.LoadOrStore(status, m.requests.WithLabelValues(m.route, strconv.Itoa(status)))
	}
	c.(prometheus.Counter).Inc()
	m.duration().Observe(took.Seconds())
}
