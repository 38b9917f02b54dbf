package partition

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/sinks"
)

// A transaction that meets a limit Postgres sets on a statement or a
// transaction (a *sinks.LimitError: statement_timeout and its kin) would
// meet it again if tried unchanged. The worker commits smaller ones
// instead: a transaction of several batches is applied again with half
// as many batches per transaction (down to one), and a batch alone in its
// transaction is applied in parts of half its records, each part
// committed with the offset after it, in order. After growAfter
// transactions in a row commit, the size doubles back towards the
// configured one. The worker's first shrink says once which limit was
// met and which flags bound the size; every shrink is counted in
// projector_transaction_shrinks_total.

// growAfter is how many transactions in a row must commit before a
// shrunk transaction size doubles.
const growAfter = 8

// shrinking is how far a worker's transactions are shrunk.
type shrinking struct {
	// batches is the most batches a transaction covers (0: CommitMaxBatches).
	batches int
	// ok counts the transactions committed in a row since the last change.
	ok int
	// said is set once a shrink has been logged: the worker's later ones
	// (a size grown back that meets the limit again) are only counted.
	said bool
}

func newShrinksCounter(reg prometheus.Registerer, labels prometheus.Labels) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "projector_transaction_shrinks_total",
		ConstLabels: labels,
		Help:        "Transactions applied again in smaller ones because they met a limit Postgres sets on a statement or transaction, by SQLSTATE (57014 statement_timeout, 25P04 transaction_timeout, 25P03 idle_in_transaction_session_timeout, 53400 temp_file_limit).",
	}, []string{"sqlstate"})
	reg.MustRegister(c)
	return c
}

// commitMaxBatches is the most full batches' worth of records one
// transaction covers now.
func (w *Worker) commitMaxBatches() int {
	if b := w.shrink.batches; b > 0 {
		return b
	}
	return w.cfg.CommitMaxBatches
}

// shrinkFor makes the worker's transactions smaller after one of batches
// batches and records records met lim; it reports false when it is as
// small as a transaction gets (one record).
func (w *Worker) shrinkFor(lim *sinks.LimitError, batches, records int) bool {
	s := &w.shrink
	switch {
	case batches > 1:
		s.batches = max(1, batches/2)
	case records > 1:
		s.batches = 1
		w.partMax.Store(int64(max(1, records/2)))
	default:
		return false
	}
	s.ok = 0
	w.metrics.shrinks.WithLabelValues(lim.SQLState).Inc()
	if !s.said {
		s.said = true
		w.log.Warn("a transaction met a limit PostgreSQL sets on statements or transactions; committing smaller transactions, growing back after successes (raise the setting, or lower --commit-max-batches, --batch-max-records or --member-max-records)",
			"sqlstate", lim.SQLState, "setting", lim.Setting, "value", lim.Value,
			"batches", batches, "records", records, "next_batches", s.batches, "next_batch_records", w.partMax.Load(), "err", lim.Err)
	}
	return true
}

// grown counts a committed transaction, doubling a shrunk size after
// growAfter of them in a row.
func (w *Worker) grown() {
	s := &w.shrink
	if s.batches == 0 && w.partMax.Load() == 0 {
		return
	}
	if s.ok++; s.ok < growAfter {
		return
	}
	s.ok = 0
	if p := w.partMax.Load(); p > 0 {
		batchMax, _ := w.baseLimits()
		if p*2 >= int64(batchMax) {
			p = 0
		} else {
			p *= 2
		}
		w.partMax.Store(p)
		return
	}
	if s.batches *= 2; s.batches >= w.cfg.CommitMaxBatches {
		s.batches = 0
	}
}

// processParts applies recs as process does, in parts of at most the
// batch size in effect: a part whose transaction meets a limit of
// Postgres is applied again in smaller parts.
func (w *Worker) processParts(ctx context.Context, recs []*kgo.Record) error {
	for len(recs) > 0 {
		batchMax, _ := w.limits()
		n := min(len(recs), batchMax)
		if err := w.throttle(ctx, n); err != nil {
			return err
		}
		err := w.process(ctx, recs[:n])
		var lim *sinks.LimitError
		if errors.As(err, &lim) && w.shrinkFor(lim, 1, n) {
			continue
		}
		if err != nil {
			return err
		}
		recs = recs[n:]
	}
	return nil
}

// throttle waits until n records may be applied (see Config.Throttle).
func (w *Worker) throttle(ctx context.Context, n int) error {
	t := w.cfg.Throttle
	if t == nil {
		return nil
	}
	for n > 0 {
		k := min(n, max(t.Burst(), 1))
		if err := t.WaitN(ctx, k); err != nil {
			return fmt.Errorf("throttle: %w", err)
		}
		n -= k
	}
	return nil
}

// throttled reports whether the throttle would hold up another full
// batch: a window then commits what it has rather than wait with its
// transaction's rows unwritten, so that a throttled partition still
// commits (and is not taken for stalled).
func (w *Worker) throttled() bool {
	t := w.cfg.Throttle
	if t == nil {
		return false
	}
	batchMax, _ := w.limits()
	return t.Tokens() < float64(batchMax)
}
