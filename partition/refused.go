package partition

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/projector-dev/projector/sinks"
	"github.com/prometheus/client_golang/prometheus"
)

// A batch that fails because Postgres refuses the sink's statements
// (ErrBadStatement) cannot succeed however often it is tried, and retried
// as if Postgres were down it would look like an outage. After MaxAttempts
// such failures in a row (a plan cached before the table changed succeeds
// on a later one) the partition halts: one error line,
// projector_partition_statements_refused and /readyz say so, and from then
// on it tries once per RetryCap without a line each time, so that it
// resumes by itself once the table or the grants are fixed.

func newRefusedGauge(reg prometheus.Registerer, labels prometheus.Labels) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name:        "projector_partition_statements_refused",
		ConstLabels: labels,
		Help:        "1 while a partition is halted because Postgres refuses the statements projector writes with (a table or column changed, a privilege revoked); it resumes once they are accepted, or from an offset reset (projector offsets reset).",
	}, []string{"topic", "partition"})
	reg.MustRegister(g)
	return g
}

// refusedBy counts an attempt that failed with cause, halting the
// partition when it is the MaxAttempts-th in a row refused by Postgres. It
// reports whether the partition is halted so: the backoff is then quiet.
func (w *Worker) refusedBy(what string, cause error) (quiet bool) {
	if !errors.Is(cause, sinks.ErrBadStatement) {
		return w.refusing
	}
	w.badStatements++
	if w.badStatements < w.cfg.MaxAttempts || w.refusing {
		return w.refusing
	}
	w.refusing = true
	w.Halt(sinks.HaltStatementsRefused, fmt.Sprintf("%s: %v; fix the table or the grants and the partition resumes (it tries again every %s)", what, cause, w.cfg.RetryCap))
	w.metrics.refused.WithLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Set(1)
	w.log.Error("partition halted: Postgres refuses the statements projector writes with, and retrying cannot help until the table or the grants are fixed",
		"what", what, "attempts", w.badStatements, "err", cause)
	return true
}

// accepted ends a run of refused attempts: an attempt succeeded. A
// partition halted by them resumes.
func (w *Worker) accepted() {
	w.badStatements = 0
	if !w.refusing {
		return
	}
	w.leaveRefused()
	w.log.Info("partition resumed: Postgres accepts its statements again")
}

// leaveRefused ends a halt for refused statements, if any, without a word:
// as the worker stops, the partition is no longer this member's to report.
func (w *Worker) leaveRefused() {
	if !w.refusing {
		return
	}
	w.refusing = false
	if !w.storm.on {
		w.halted.Store(nil) // fetching resumes with the backoff's end (see done)
	}
	w.metrics.refused.DeleteLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition)))
}
