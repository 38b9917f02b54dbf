package projector

import (
	"context"
	"slices"
	"time"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// A halted partition (a dead-letter storm, statements Postgres refuses,
// a stored offset not in the log) commits nothing, so an operator's
// offset reset (projector offsets reset), which fences the owner at its
// next commit, would never reach it. The engine therefore looks for a
// reset of every halted partition once per ResetCheckInterval, whatever
// halted it, and when it finds one it stops the halted worker and starts
// a new one from the reset offset: the halt, its gauge and its state in
// projector status end with the old worker, and the new one judges its
// records afresh (a storm guard's window holds none of the old worker's
// dead letters).

// watchHalts has the poll loop look for an operator's reset of the halted
// partitions every ResetCheckInterval, until ctx ends.
func (e *Engine) watchHalts(ctx context.Context) {
	t := time.NewTicker(ResetCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !slices.ContainsFunc(e.Workers(), func(s partition.Status) bool { return s.Halted != "" }) {
			continue
		}
		e.mu.Lock()
		e.haltsDue = true
		e.mu.Unlock()
		if stop := e.stopPoll.Load(); stop != nil {
			(*stop)()
		}
	}
}

// haltedCheck is a halted partition to look at for a reset, with the
// epoch its worker claimed it at.
type haltedCheck struct {
	tp    sinks.TP
	epoch int64
}

// haltedDue returns the halted partitions to look at for a reset when
// watchHalts says it is time, but those whose own recheck (see
// armRecheck) will. Call with mu held.
func (e *Engine) haltedDue() []haltedCheck {
	if !e.haltsDue {
		return nil
	}
	e.haltsDue = false
	var out []haltedCheck
	for tp, r := range e.workers {
		if lp := e.outOfLog[tp]; lp != nil && lp.w == r.w && lp.recheck != nil {
			continue
		}
		if r.w.Status().Halted != "" {
			out = append(out, haltedCheck{tp: tp, epoch: r.epoch})
		}
	}
	return out
}

// retire stops the worker running tp, if any, and waits for it (at most
// RevokeTimeout) before a new worker takes the partition from a reset
// offset, so that what the old one undoes as it stops (its halt's gauge,
// its paused fetching) cannot undo the new one's. It returns the old
// worker's halt ("": none).
func (e *Engine) retire(tp sinks.TP) (halt string) {
	e.mu.Lock()
	r := e.workers[tp]
	if r != nil {
		halt = r.w.Status().HaltKind
		delete(e.workers, tp)
		e.owned.Store(int64(len(e.workers)))
		r.w.Stop()
	}
	e.mu.Unlock()
	if r != nil {
		e.wait([]*running{r}, e.cfg.RevokeTimeout, "offset reset")
	}
	return halt
}
