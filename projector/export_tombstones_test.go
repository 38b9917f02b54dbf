package projector

import (
	"time"

	"github.com/projector-dev/projector/projection"
)

// SetTombstonePruning makes e prune first after first, then every every,
// batch tombstones per statement. It does nothing to an engine that
// prunes none.
func SetTombstonePruning(e *Engine, first, every time.Duration, batch int) {
	if e.pruner != nil {
		e.pruner.first, e.pruner.every, e.pruner.batch = first, every, batch
	}
}

// TombstoneRetentions gives the retention e prunes each projection's
// tombstones with, by projection name; a projection whose tombstones
// are kept forever is missing.
func TombstoneRetentions(e *Engine) map[string]string {
	out := map[string]string{}
	if e.pruner == nil {
		return out
	}
	for _, p := range e.pruner.projs {
		out[p.Name] = projection.FormatRetention(e.pruner.retention[p.Name])
	}
	return out
}
