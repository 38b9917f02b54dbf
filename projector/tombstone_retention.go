package projector

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/projection"
)

// DefaultTombstoneRetention is how long a deleted aggregate's tombstone is
// kept unless Config.TombstoneRetention or the projection says otherwise:
// seven days, Kafka's default retention.ms, so that on a topic kept for
// the default time no record still in the log that a replay or an offset
// reset could read again is older than a tombstone that was pruned, and
// seven times Kafka's default delete.retention.ms, which gives a compacted
// topic's own tombstones a day. Late copies from a producer's or an
// outbox relay's retries come within minutes.
const DefaultTombstoneRetention = 7 * 24 * time.Hour

// TombstonePruner is a Store that deletes tombstones past their
// retention (postgres.Store is one). The engine prunes those of its
// projections' tables in the background when its store is one.
type TombstonePruner interface {
	// PruneTombstones deletes the tombstones of table written before
	// before, in batches of at most batch rows, each committed on its
	// own, and returns how many it deleted. Several members pruning one
	// table at the same time must be harmless.
	PruneTombstones(ctx context.Context, table string, before time.Time, batch int) (int64, error)
}

// tombstonePruneEvery is how often the engine prunes tombstones at most:
// a tombstone outlives its retention by up to this much.
const tombstonePruneEvery = time.Hour

// tombstonePruner deletes, in the background, the tombstones of the
// engine's projections that are past their retention. Every member of an
// identity runs one; with nothing due a run costs an index probe per
// projection, and members pruning together share the rows (see
// TombstonePruner).
type tombstonePruner struct {
	store TombstonePruner
	// projs are the projections whose tombstones are pruned, retention
	// their retention (a projection that keeps them forever is left out).
	projs     []*projection.Projection
	retention map[string]time.Duration
	every     time.Duration // how often it prunes
	first     time.Duration // how long after Run starts it prunes first
	batch     int           // rows per statement; 0: the store's default
	now       func() time.Time
	log       *slog.Logger
	pruned    *prometheus.CounterVec
}

// newTombstonePruner returns the pruner of the engine's projections, or
// nil when its store cannot prune or every projection keeps its
// tombstones forever. Its counter has a series per projection from the
// start.
func newTombstonePruner(cfg *Config, log *slog.Logger) *tombstonePruner {
	store, ok := cfg.Store.(TombstonePruner)
	if !ok {
		return nil
	}
	p := &tombstonePruner{
		store:     store,
		retention: map[string]time.Duration{},
		every:     tombstonePruneEvery,
		first:     time.Minute,
		now:       time.Now,
		log:       log,
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "projector_tombstones_pruned_total",
			ConstLabels: prometheus.Labels{"group": cfg.Identity},
			Help:        "Tombstones of deleted aggregates this member pruned because they were older than the projection's tombstone retention.",
		}, []string{"projection"}),
	}
	for _, proj := range cfg.Projections {
		p.pruned.WithLabelValues(proj.Name)
		r := proj.TombstoneRetention
		if r == 0 {
			r = cfg.TombstoneRetention
		}
		if r < 0 {
			continue
		}
		p.projs = append(p.projs, proj)
		p.retention[proj.Name] = r
		// A short retention is pruned more often, so that a tombstone
		// does not outlive it many times over.
		p.every = max(min(p.every, r/2), time.Second)
	}
	cfg.Registerer.MustRegister(p.pruned)
	if len(p.projs) == 0 {
		return nil
	}
	p.first = min(p.first, p.every)
	return p
}

// run prunes first a little after the member starts, when its claims
// and first batches are done, then every p.every until ctx ends.
func (p *tombstonePruner) run(ctx context.Context) {
	t := time.NewTimer(p.first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.prune(ctx)
		t.Reset(p.every)
	}
}

// prune deletes each projection's tombstones past its retention, and says
// so in one line when it deleted any. A projection whose pruning fails is
// tried again at the next run.
func (p *tombstonePruner) prune(ctx context.Context) {
	var (
		total int64
		attrs []any
	)
	now := p.now()
	for _, proj := range p.projs {
		before := now.Add(-p.retention[proj.Name])
		n, err := p.store.PruneTombstones(ctx, proj.Table, before, p.batch)
		p.pruned.WithLabelValues(proj.Name).Add(float64(n))
		if n > 0 {
			total += n
			attrs = append(attrs, slog.Group(proj.Name, "table", proj.Table, "pruned", n,
				"retention", projection.FormatRetention(p.retention[proj.Name]), "deleted_before", before.UTC().Format(time.RFC3339)))
		}
		if err != nil {
			if ctx.Err() != nil {
				return // stopping
			}
			p.log.Warn("pruning tombstones failed; tried again at the next run", "projection", proj.Name, "table", proj.Table,
				"next_run_in", p.every.String(), "err", err)
		}
	}
	if total > 0 {
		p.log.Info("pruned tombstones past their retention", append([]any{"pruned", total}, attrs...)...)
	}
}
