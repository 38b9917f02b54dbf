package partition

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/sinks"
)

// Metrics are the counters every worker of an engine shares.
type Metrics struct {
	processed      *prometheus.CounterVec
	commitDuration prometheus.Histogram
	batchRecords   prometheus.Histogram
	commitBatches  prometheus.Histogram
	replays        prometheus.Counter
	fenced         prometheus.Counter
	refused        *prometheus.GaugeVec
	storm          *prometheus.GaugeVec
	retries        *prometheus.CounterVec
	backoff        *prometheus.GaugeVec
	deadLetters    *prometheus.CounterVec
	gaps           *prometheus.CounterVec
	repairFailures *prometheus.CounterVec
	skipped        *prometheus.CounterVec
	shrinks        *prometheus.CounterVec
}

// NewMetrics registers the worker metrics with reg, each with the
// constant labels given (the engine's: its consumer group), so that the
// workers of several engines share one registry.
func NewMetrics(reg prometheus.Registerer, labels prometheus.Labels) *Metrics {
	m := &Metrics{
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "projector_records_processed_total",
			ConstLabels: labels,
			Help:        "Records processed, by outcome: applied, stale (duplicate or older version), parked (waiting for a missing version), dead_lettered.",
		}, []string{"projection", "topic", "outcome"}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "projector_batch_commit_duration_seconds",
			ConstLabels: labels,
			Help:        "Duration of one transaction: load state, write rows, parked events, dead letters and the offset, commit.",
			Buckets:     prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "projector_batch_records",
			ConstLabels: labels,
			Help:        "Records one committed batch covered, at most --batch-max-records or the partition's share of --member-max-records.",
			Buckets:     prometheus.ExponentialBuckets(1, 2, 14),
		}),
		commitBatches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "projector_commit_batches",
			ConstLabels: labels,
			Help:        "Batches one transaction covered: 1, or more while the partition is behind (up to --commit-max-batches full ones' worth of records).",
			Buckets:     prometheus.ExponentialBuckets(1, 2, 7),
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "projector_commit_replays_total",
			ConstLabels: labels,
			Help:        "Transactions of several batches applied again batch by batch: Postgres did not hold what they were planned on, or refused a row.",
		}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "projector_fenced_batches_total",
			ConstLabels: labels,
			Help:        "Batches rolled back because a newer owner had claimed the partition.",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "projector_retries_total",
			ConstLabels: labels,
			Help:        "Attempts retried after a transient failure (database, registry or broker unavailable).",
		}, []string{"topic", "partition", "reason"}),
	}
	m.backoff = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name:        "projector_backoff_active",
		ConstLabels: labels,
		Help:        "1 while the partition's worker backs off after a failure (its fetching is paused), else 0.",
	}, []string{"topic", "partition"})
	m.refused = newRefusedGauge(reg, labels)
	m.storm = newStormGauge(reg, labels)
	m.shrinks = newShrinksCounter(reg, labels)
	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "projector_dead_letters_total",
		ConstLabels: labels,
		Help:        "Records dead-lettered, by reason: decode, invalid, invalid_key, key_mismatch, fold, oversized, invalid_value, rejected, refused, gap.",
	}, []string{"projection", "reason"})
	m.gaps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "projector_gaps_total",
		ConstLabels: labels,
		Help:        "Aggregates that stopped waiting for a missing version, by resolution: filled (it arrived), repaired, dead_lettered.",
	}, []string{"projection", "resolution"})
	m.repairFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "projector_gap_repair_failures_total",
		ConstLabels: labels,
		Help:        "Gap repair attempts that got no usable answer, by reason: unavailable (the source or Postgres is down; retried without limit), not_found (the source has nothing for the gap; its parked events are dead-lettered), failed (any other error; dead-lettered after --max-attempts).",
	}, []string{"projection", "reason"})
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "projector_records_skipped_total",
		ConstLabels: labels,
		Help:        "Offsets skipped because retention deleted them before they were applied (--on-offset-lost=skip).",
	}, []string{"topic", "partition"})
	reg.MustRegister(m.processed, m.commitDuration, m.batchRecords, m.commitBatches, m.replays, m.fenced, m.retries, m.backoff, m.deadLetters, m.gaps, m.repairFailures, m.skipped)
	return m
}

// The label values each counter can take, so that its series exist at 0
// from the start: a fresh member then looks like a healthy one, and
// rate() has a first sample to start from.
var (
	processedOutcomes = []string{"applied", "stale", "parked", "dead_lettered"}
	gapResolutions    = []string{"filled", "repaired", "dead_lettered"}
	repairFailReasons = []string{"unavailable", "not_found", "failed"}
	retryReasons      = []string{"fold", "dead_letter_storm", "timeout", "postgres", "error"}
	shrinkSQLStates   = []string{"57014", "25P04", "25P03", "53400"}
)

// Known creates the series of projection's counters at 0: the records
// processed from topic by outcome, dead letters by class, gaps by
// resolution, repair failures by reason, and transaction shrinks.
func (m *Metrics) Known(projection, topic string) {
	for _, o := range processedOutcomes {
		m.processed.WithLabelValues(projection, topic, o)
	}
	for _, c := range sinks.Classes {
		m.deadLetters.WithLabelValues(projection, c)
	}
	for _, r := range gapResolutions {
		m.gaps.WithLabelValues(projection, r)
	}
	for _, r := range repairFailReasons {
		m.repairFailures.WithLabelValues(projection, r)
	}
	for _, s := range shrinkSQLStates {
		m.shrinks.WithLabelValues(s)
	}
}

// knownPartition creates the series of a claimed partition's counters at
// 0: its retries by reason and its skipped offsets.
func (m *Metrics) knownPartition(tp sinks.TP) {
	p := strconv.Itoa(int(tp.Partition))
	for _, r := range retryReasons {
		m.retries.WithLabelValues(tp.Topic, p, r)
	}
	m.skipped.WithLabelValues(tp.Topic, p)
}
