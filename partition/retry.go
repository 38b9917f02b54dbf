package partition

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/projector-dev/projector/internal/backoff"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/sinks"
)

// errStopped ends a backoff when the worker is asked to stop.
var errStopped = errors.New("worker stopped")

// retry runs fn until it succeeds, backing off with full jitter between
// attempts, or until ctx ends.
func (w *Worker) retry(ctx context.Context, what string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil {
			w.done()
			return nil
		}
		if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil {
			return err
		}
		if err := w.backoff(ctx, attempt, what, err); err != nil {
			return err
		}
	}
}

// backoff waits before the next attempt, with fetching of the partition
// paused so that nothing piles up meanwhile. done ends the run of attempts.
// Stop ends the wait with errStopped.
func (w *Worker) backoff(ctx context.Context, attempt int, what string, cause error) error {
	return w.backoffUnless(ctx, attempt, what, cause, false)
}

// backoffPlanned is backoff before a transaction of planned batches is
// tried again: a worker told to Drain keeps waiting, to try it again.
func (w *Worker) backoffPlanned(ctx context.Context, attempt int, what string, cause error) error {
	return w.backoffUnless(ctx, attempt, what, cause, true)
}

// backoffUnless is backoff, which Stop ends unless planned is set and the
// worker drains.
func (w *Worker) backoffUnless(ctx context.Context, attempt int, what string, cause error, planned bool) error {
	if w.backoffSince.CompareAndSwap(0, time.Now().UnixNano()) {
		w.mu.Lock()
		w.syncFetch()
		w.mu.Unlock()
		w.metrics.backoff.WithLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Set(1)
	}
	if cause != nil {
		msg := what + ": " + redact.ClipTo(redact.String(cause.Error()), 4*redact.MaxQuoted)
		w.backoffErr.Store(&msg)
	}
	quiet := w.refusedBy(what, cause) || w.storm.on
	delay := backoff.Policy{Base: w.cfg.RetryBase, Cap: w.cfg.RetryCap}.Delay(attempt)
	w.metrics.retries.WithLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition)), reasonOf(cause)).Inc()
	if quiet {
		delay = w.cfg.RetryCap // halted: said once, tried now and then
	} else {
		w.log.Warn("transient failure; retrying", "what", what, "attempt", attempt+1, "delay", delay, "err", cause)
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	stop := w.stop
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			if !planned || !w.draining.Load() {
				return errStopped // a revocation must not wait out the delay
			}
			stop = nil // draining: tried again until ctx ends
		case <-t.C:
			return nil
		}
	}
}

// done ends a run of failed attempts: fetching resumes unless the buffer
// is full.
func (w *Worker) done() {
	w.accepted()
	if w.backoffSince.Swap(0) == 0 {
		return
	}
	w.backoffErr.Store(nil)
	w.metrics.backoff.WithLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition))).Set(0)
	w.mu.Lock()
	w.syncFetch()
	w.mu.Unlock()
}

// reasonOf labels a transient failure for the retries metric.
func reasonOf(err error) string {
	var (
		ne   interface{ Timeout() bool }
		fr   *foldRetry
		trip *stormTrip
	)
	switch {
	case errors.As(err, &fr):
		return "fold"
	case errors.As(err, &trip):
		return "dead_letter_storm"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return "postgres"
	}
	return "error"
}
