package projector

import (
	"context"
	"time"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/partition"
)

// DefaultRedriveInterval is how often an engine looks for dead letters
// queued for redrive unless told otherwise (see Config.RedriveInterval).
const DefaultRedriveInterval = time.Second

// redriveSource is what the engine's workers read their partitions'
// queued redrives from (nil: the store keeps no dead letters).
func (e *Engine) redriveSource() partition.RedriveSource {
	if e.dead == nil {
		return nil
	}
	return deadletters.Redrives{Pool: e.dead.DeadLetterPool(), Identity: e.gen.identity}
}

// watchRedrives looks at the redrive queue every RedriveInterval, one
// query for the engine's partitions however many there are (the workers
// pay nothing while it is empty), and tells the workers of the
// partitions that have dead letters queued to apply them. Redrives of a
// partition this member does not own wait for its owner's engine. A
// failed look is logged when it begins to fail and when it works again,
// not on every tick.
func (e *Engine) watchRedrives(ctx context.Context) {
	src := deadletters.Redrives{Pool: e.dead.DeadLetterPool(), Identity: e.gen.identity}
	t := time.NewTicker(e.cfg.RedriveInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tps, err := src.Waiting(ctx)
		if err != nil {
			if !failing && ctx.Err() == nil {
				e.log.Warn("looking for dead letters queued for redrive failed; trying again each interval", "err", err)
			}
			failing = true
			continue
		}
		if failing {
			e.log.Info("looking for dead letters queued for redrive works again")
			failing = false
		}
		if len(tps) == 0 {
			continue
		}
		e.mu.Lock()
		for _, tp := range tps {
			if r := e.workers[tp]; r != nil {
				r.w.Redrive()
			}
		}
		e.mu.Unlock()
	}
}
