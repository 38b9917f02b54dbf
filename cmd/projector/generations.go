package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/sr"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks/postgres"
)

// rebuildFlags are run's settings of the generations being built here.
type rebuildFlags struct {
	auto        bool
	rate        int
	conns       int
	checkEvery  time.Duration
	lockTimeout time.Duration
	cutoverLag  int64
}

func (r *rebuildFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&r.auto, "auto-rebuild", false, "when the projection file defines a projection otherwise than its live generation, start its rebuild (one operation however many replicas start); without it the live generation keeps serving and the log gives the command")
	fs.IntVar(&r.rate, "rebuild-rate", rebuild.DefaultRate, "most records a second a generation being rebuilt applies on this member, so that live traffic wins; 0: no limit")
	fs.IntVar(&r.conns, "rebuild-database-max-conns", 0, "PostgreSQL connections a generation being rebuilt may use on this member, apart from the live ones' pool; 0: a quarter of --database-max-conns, at least 2")
	fs.DurationVar(&r.checkEvery, "rebuild-check-every", rebuild.DefaultPoll, "how often the member looks at rebuild operations and generations")
	fs.DurationVar(&r.lockTimeout, "rebuild-lock-timeout", rebuild.DefaultLockTimeout, "longest the cutover waits for a lock on a projection's table before it gives up and tries again, so that readers never queue behind it for longer")
	fs.Int64Var(&r.cutoverLag, "rebuild-cutover-lag", rebuild.DefaultCutoverLag, "records behind the log end every partition of a rebuilt generation must be within for its cutover to begin")
}

func (r *rebuildFlags) validate() error {
	if r.rate < 0 {
		return fmt.Errorf("--rebuild-rate %d: want a rate of records a second, or 0 for no limit", r.rate)
	}
	if r.conns < 0 {
		return fmt.Errorf("--rebuild-database-max-conns %d: want a number of connections, or 0 for a quarter of --database-max-conns", r.conns)
	}
	if r.checkEvery <= 0 || r.lockTimeout <= 0 || r.cutoverLag < 0 {
		return fmt.Errorf("--rebuild-check-every, --rebuild-lock-timeout: want positive durations; --rebuild-cutover-lag: want 0 or more")
	}
	return nil
}

// liveProjections returns the projections as their live generations
// define them, each writing its generation's table, run as the file says
// (a projection without generations yet, as the file defines it).
func liveProjections(ctx context.Context, store *rebuild.Store, identity string, projs []*projection.Projection) ([]*projection.Projection, error) {
	live, err := store.Live(ctx, identity)
	if err != nil {
		return nil, err
	}
	out := make([]*projection.Projection, 0, len(projs))
	for _, p := range projs {
		g, ok := live[p.Name]
		if !ok {
			out = append(out, p)
			continue
		}
		lp, err := g.Definition.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("live generation %d of projection %s: %w", g.N, p.Name, err)
		}
		lp.Table = g.PhysicalTable
		out = append(out, lp)
	}
	return out, nil
}

// generationEngines builds the engines the supervisor asks for: each on
// its own metrics registry (labelled with its generation) gathered with
// the process's, so that an engine stopped and built again registers
// afresh.
type generationEngines struct {
	f        *runFlags
	brokers  []string
	registry *sr.Client
	log      *slog.Logger
	pool     *pgxpool.Pool
	tp       trace.TracerProvider
	gather   *gatherers

	mu         sync.Mutex
	rebuilding *pgxpool.Pool // the pool of generations being built, opened once needed
	poolCfg    *pgxpool.Config
	// readers are startup's reader schemas of the projections whose
	// schema text was schemas'.
	readers map[string]avro.Schema
	schemas map[string]string
}

func (g *generationEngines) rebuildPool() (*pgxpool.Pool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rebuilding != nil {
		return g.rebuilding, nil
	}
	cfg := g.poolCfg.Copy()
	conns := int32(g.f.rebuild.conns)
	if conns == 0 {
		conns = max(2, cfg.MaxConns/4)
	}
	cfg.MaxConns = conns
	cfg.MinConns = 0
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("open the pool of rebuilds: %w", err)
	}
	g.rebuilding = p
	return p, nil
}

// readerSchemas are the startup's reader schemas where a projection's
// schema is the one startup read them for, the registry's otherwise (a
// generation defined with another schema).
func (g *generationEngines) readerSchemas(ctx context.Context, projs []*projection.Projection) (map[string]avro.Schema, error) {
	out := map[string]avro.Schema{}
	var fetch []*projection.Projection
	for _, p := range projs {
		if r, ok := g.readers[p.Name]; ok && g.schemas[p.Name] == p.Schema {
			out[p.Name] = r
			continue
		}
		fetch = append(fetch, p)
	}
	if len(fetch) == 0 {
		return out, nil
	}
	more, err := readerSchemas(ctx, g.registry, fetch)
	if err != nil {
		return nil, err
	}
	maps.Copy(out, more)
	return out, nil
}

func (g *generationEngines) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rebuilding != nil {
		g.rebuilding.Close()
	}
}

func (g *generationEngines) build(ctx context.Context, sp rebuild.EngineSpec) (rebuild.Engine, error) {
	pool := g.pool
	if sp.Rebuild {
		var err error
		if pool, err = g.rebuildPool(); err != nil {
			return nil, err
		}
	}
	// Each column's type as Postgres names it, as the sinks want.
	if err := postgres.Migrate(ctx, pool, sp.Projections...); err != nil {
		return nil, err
	}
	readers, err := g.readerSchemas(ctx, sp.Projections)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"generation": strconv.Itoa(sp.Generation)}, reg)
	f := *g.f
	f.identity = sp.Group
	if sp.Rebuild {
		f.startFrom = projector.StartEarliest
		// A rebuild dead-letters the history's poison records again:
		// their copies stay in Postgres, under the new generation's
		// identity, rather than reach the dead-letter topic's readers a
		// second time. Once live, its new ones are published.
		f.dlqTopic = ""
		if sp.Limiter != nil {
			f.throttle = sp.Limiter
		}
	}
	e, err := newEngine(&f, g.brokers, sp.Projections, g.registry, readers, g.log, pool, labelled, g.tp)
	if err != nil {
		return nil, err
	}
	remove := g.gather.add(reg)
	return &gatheredEngine{Engine: e, remove: remove}, nil
}

// gatheredEngine stops being gathered once it has run.
type gatheredEngine struct {
	*projector.Engine
	remove func()
}

func (e *gatheredEngine) Run(ctx context.Context) error {
	defer e.remove()
	return e.Engine.Run(ctx)
}

// gatherers gathers the process's registry and every running engine's.
type gatherers struct {
	base *prometheus.Registry
	mu   sync.Mutex
	regs []*prometheus.Registry
}

func (g *gatherers) add(r *prometheus.Registry) func() {
	g.mu.Lock()
	g.regs = append(g.regs, r)
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.regs = slices.DeleteFunc(g.regs, func(x *prometheus.Registry) bool { return x == r })
		g.mu.Unlock()
	}
}

func (g *gatherers) Gather() ([]*dto.MetricFamily, error) {
	g.mu.Lock()
	all := prometheus.Gatherers{g.base}
	for _, r := range g.regs {
		all = append(all, r)
	}
	g.mu.Unlock()
	return all.Gather()
}

// newSupervisor builds the supervisor of the deployment's generations.
func newSupervisor(f *runFlags, projs []*projection.Projection, store *rebuild.Store, adm *kadm.Client, engines *generationEngines, pool *pgxpool.Pool, metrics prometheus.Registerer, log *slog.Logger) *rebuild.Supervisor {
	rate := float64(f.rebuild.rate)
	if rate == 0 {
		rate = -1
	}
	return rebuild.New(rebuild.Config{
		Identity:    f.identity,
		Projections: projs,
		Store:       store,
		Admin:       rebuild.KafkaAdmin(adm),
		NewEngine: func(sp rebuild.EngineSpec) (rebuild.Engine, error) {
			ctx, cancel := context.WithTimeout(context.Background(), f.startupTimeout)
			defer cancel()
			return engines.build(ctx, sp)
		},
		Migrate: func(ctx context.Context, p *projection.Projection) error {
			return postgres.Migrate(ctx, pool, p)
		},
		Logger:      log,
		Metrics:     rebuild.NewMetrics(metrics),
		AutoRebuild: f.rebuild.auto,
		ConfigPath:  f.config,
		Poll:        f.rebuild.checkEvery,
		Rate:        rate,
		LockTimeout: f.rebuild.lockTimeout,
		CutoverLag:  f.rebuild.cutoverLag,
	})
}

// adminClient is the supervisor's Kafka admin client.
func adminClient(f *runFlags, brokers []string, log *slog.Logger) (*kadm.Client, func(), error) {
	cl, err := kafkaclient.New(kafkaclient.Config{Brokers: brokers, Logger: log, Extra: f.clientOpts})
	if err != nil {
		return nil, nil, fmt.Errorf("kafka admin client: %w", err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}
