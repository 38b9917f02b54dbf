package projector

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/sinks"
)

// groupMetrics describe this member's view of its consumer group.
type groupMetrics struct {
	rebalances    prometheus.Counter
	assigned      prometheus.Gauge
	revoked, lost prometheus.Counter
	lastRebalance prometheus.Gauge
	halted        *prometheus.GaugeVec
	stalled       *prometheus.GaugeVec // see stall.go
}

func newGroupMetrics(reg prometheus.Registerer, labels prometheus.Labels) *groupMetrics {
	m := &groupMetrics{
		rebalances: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "projector_rebalances_total", Help: "Rebalances this member took part in (each ends with an assignment, possibly empty).", ConstLabels: labels,
		}),
		assigned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_partitions_assigned", Help: "Partitions currently assigned to this member.", ConstLabels: labels,
		}),
		revoked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "projector_partitions_revoked_total", Help: "Partitions revoked from this member.", ConstLabels: labels,
		}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "projector_partitions_lost_total", Help: "Partitions lost by this member (session expired or fenced by the group).", ConstLabels: labels,
		}),
		lastRebalance: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_last_rebalance_timestamp_seconds", Help: "Unix time of the last rebalance this member saw.", ConstLabels: labels,
		}),
	}
	m.halted = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "projector_partition_halted", Help: "1 while a partition is halted because its stored offset is not in the log: reason records_deleted (below the log start), beyond_log_end (past the log end: topic recreated) or unknown (the log's bounds could not be listed).", ConstLabels: labels,
	}, []string{"topic", "partition", "reason"})
	reg.MustRegister(m.rebalances, m.assigned, m.revoked, m.lost, m.lastRebalance, m.halted)
	return m
}

// assignedNow records a finished rebalance: each one ends with an
// assignment, possibly empty.
func (m *groupMetrics) assignedNow(added map[string][]int32) {
	m.rebalances.Inc()
	m.assigned.Add(float64(count(added)))
	m.lastRebalance.SetToCurrentTime()
}

func (m *groupMetrics) removed(removed map[string][]int32) {
	m.assigned.Sub(float64(count(removed)))
	m.lastRebalance.SetToCurrentTime()
}

var (
	lagDesc = prometheus.NewDesc("projector_consumer_lag",
		"Records not yet committed: high watermark minus the stored next offset. Of this member's partitions, and of those no member runs (exported by one member of the group).",
		[]string{"topic", "partition"}, nil)
	lagSecondsDesc = prometheus.NewDesc("projector_consumer_lag_seconds",
		"Age of the oldest record not yet committed (fetched; for a partition no member runs or one halted before fetching, the record at the stored offset, or when that is gone the time the halt began); 0 when caught up.",
		[]string{"topic", "partition"}, nil)
	drainDesc = prometheus.NewDesc("projector_backlog_drain_seconds",
		"How long this member's backlog of the topic takes to drain at the rates of the last 2 minutes: records behind / (completion rate - arrival rate); +Inf while arrivals keep up with completions, 0 without a backlog.",
		[]string{"topic"}, nil)
	gapTimeoutDesc = prometheus.NewDesc("projector_gap_timeout_seconds",
		"The projection's gap_timeout: how long parked events wait before a repair is tried (on_gap repair); alerts compare projector_oldest_parked_seconds with it.",
		[]string{"projection"}, nil)
)

var (
	parkedDesc = prometheus.NewDesc("projector_parked_events",
		"Events waiting for a missing version, in this member's partitions.", []string{"projection"}, nil)
	oldestParkedDesc = prometheus.NewDesc("projector_oldest_parked_seconds",
		"Age of the oldest parked event in this member's partitions; 0 when none.", []string{"projection"}, nil)
	repairUnavailableDesc = prometheus.NewDesc("projector_gap_repair_unavailable",
		"Aggregates in this member's partitions whose gap repair found the repair source (or Postgres) unavailable and waits to retry; their events stay parked. Above 0 for long: the source is down.",
		[]string{"projection"}, nil)
	deadLetterDepthDesc = prometheus.NewDesc("projector_dead_letters",
		"Open dead letters of this identity, by projection.", []string{"projection"}, nil)
	cacheEntriesDesc = prometheus.NewDesc("projector_state_cache_entries",
		"Aggregates whose state the projection's state cache holds.", []string{"projection"}, nil)
	cacheBytesDesc = prometheus.NewDesc("projector_state_cache_bytes",
		"What the state cache counts against --state-cache-bytes: its entries and its partitions.", []string{"projection"}, nil)
	cacheLookupsDesc = prometheus.NewDesc("projector_state_cache_lookups_total",
		"Aggregates a batch needed, found in the state cache (hit) or read from Postgres (miss); those first seen in their batch are neither.",
		[]string{"projection", "result"}, nil)
	tombstoneChecksDesc = prometheus.NewDesc("projector_tombstone_checks_total",
		"Rows of aggregates first seen in their batch, inserted once the tombstone filter ruled out a tombstone (filter) or after probing Postgres for one (probe).",
		[]string{"projection", "check"}, nil)
)

// lagCollector reports lag per assigned partition, parked events and
// dead-letter depth at scrape time.
type lagCollector struct{ e *Engine }

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- lagSecondsDesc
	ch <- drainDesc
	ch <- gapTimeoutDesc
	ch <- parkedDesc
	ch <- oldestParkedDesc
	ch <- repairUnavailableDesc
	ch <- deadLetterDepthDesc
	ch <- cacheEntriesDesc
	ch <- cacheBytesDesc
	ch <- cacheLookupsDesc
	ch <- tombstoneChecksDesc
}

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	parked := map[string]int{}
	unavailable := map[string]int{}
	oldest := map[string]time.Time{}
	for _, p := range c.e.cfg.Projections {
		parked[p.Name] = 0
	}
	add := func(name string, n int, since time.Time) {
		parked[name] += n
		if !since.IsZero() && (oldest[name].IsZero() || since.Before(oldest[name])) {
			oldest[name] = since
		}
	}
	for _, s := range c.e.Workers() {
		add(s.Projection, s.Parked, s.OldestParked)
		unavailable[s.Projection] += s.RepairUnavailable
		for _, o := range s.Others {
			add(o.Projection, o.Parked, o.OldestParked)
		}
	}
	for _, p := range c.e.cfg.Projections {
		ch <- prometheus.MustNewConstMetric(gapTimeoutDesc, prometheus.GaugeValue, p.GapTimeout.Seconds(), p.Name)
	}
	for topic, s := range c.e.drain.estimates() {
		ch <- prometheus.MustNewConstMetric(drainDesc, prometheus.GaugeValue, s, topic)
	}
	for name, n := range parked {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(n), name)
		age := 0.0
		if t := oldest[name]; !t.IsZero() {
			age = max(0, now.Sub(t).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(oldestParkedDesc, prometheus.GaugeValue, age, name)
		ch <- prometheus.MustNewConstMetric(repairUnavailableDesc, prometheus.GaugeValue, float64(unavailable[name]), name)
	}
	if c.e.dead != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		depth, err := c.e.dead.DeadLetterDepth(ctx, c.e.cfg.Identity)
		cancel()
		if err == nil {
			for _, p := range c.e.cfg.Projections {
				ch <- prometheus.MustNewConstMetric(deadLetterDepthDesc, prometheus.GaugeValue, float64(depth[p.Name]), p.Name)
			}
		}
	}
	for _, p := range c.e.cfg.Projections {
		cs := c.e.gen.sinks[p.Name].cache
		if cs == nil {
			continue
		}
		st := cs.CacheStats()
		ch <- prometheus.MustNewConstMetric(cacheEntriesDesc, prometheus.GaugeValue, float64(st.Entries), p.Name)
		ch <- prometheus.MustNewConstMetric(cacheBytesDesc, prometheus.GaugeValue, float64(st.Bytes), p.Name)
		ch <- prometheus.MustNewConstMetric(cacheLookupsDesc, prometheus.CounterValue, float64(st.Hits), p.Name, "hit")
		ch <- prometheus.MustNewConstMetric(cacheLookupsDesc, prometheus.CounterValue, float64(st.Misses), p.Name, "miss")
	}
	for _, p := range c.e.cfg.Projections {
		tc := c.e.gen.sinks[p.Name].tombstones
		if tc == nil {
			continue
		}
		ruledOut, probed := tc.TombstoneChecks()
		ch <- prometheus.MustNewConstMetric(tombstoneChecksDesc, prometheus.CounterValue, float64(ruledOut), p.Name, "filter")
		ch <- prometheus.MustNewConstMetric(tombstoneChecksDesc, prometheus.CounterValue, float64(probed), p.Name, "probe")
	}
	unowned, times := c.e.unownedNow()
	running := map[sinks.TP]bool{}
	for _, s := range c.e.Workers() {
		running[s.TP] = true
		labels := []string{s.Topic, strconv.Itoa(int(s.Partition))}
		// Past the log end (the topic was created again) there is no lag
		// to tell: projector_partition_halted says why.
		if s.HighWatermark >= 0 && s.NextOffset <= s.HighWatermark {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(max(0, s.HighWatermark-s.NextOffset)), labels...)
		}
		oldest := s.Oldest
		if oldest.IsZero() && s.Halted != "" {
			// Halted before it fetched a record: the record at its stored
			// offset, or the halt's start when that record is gone.
			oldest = s.HaltedSince
			if rt, ok := times[s.TP]; ok && rt.offset == s.NextOffset && !rt.at.IsZero() {
				oldest = rt.at
			}
		}
		age := 0.0
		if !oldest.IsZero() {
			age = max(0, now.Sub(oldest).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(lagSecondsDesc, prometheus.GaugeValue, age, labels...)
	}
	// Partitions no member runs (see unowned.go), but those a worker took
	// since they were looked at.
	for _, u := range unowned {
		if running[u.tp] {
			continue
		}
		labels := []string{u.tp.Topic, strconv.Itoa(int(u.tp.Partition))}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(u.lag), labels...)
		age := 0.0
		if !u.oldest.IsZero() {
			age = max(0, now.Sub(u.oldest).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(lagSecondsDesc, prometheus.GaugeValue, age, labels...)
	}
}
