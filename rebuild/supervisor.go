package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/projector-dev/projector/projection"
)

// Engine is what the supervisor runs for one consumer identity: a
// projector.Engine.
type Engine interface {
	Run(ctx context.Context) error
	Stop(ctx context.Context) error
	Ready(ctx context.Context) map[string]error
	Live(ctx context.Context) map[string]error
}

// EngineSpec says which engine to build.
type EngineSpec struct {
	// Group is the consumer identity: group id and stored offsets.
	Group string
	// Generation is the generation its projections run at (1 for the
	// deployment's identity).
	Generation int
	// Projections, each with Table set to its generation's table.
	Projections []*projection.Projection
	// Rebuild is set for a generation being built: it starts from the
	// earliest offset, on its share of Postgres connections, at most as
	// fast as Limiter allows.
	Rebuild bool
	Limiter *rate.Limiter
}

// key identifies the engine a spec builds: a spec of another key is
// another engine.
func (s EngineSpec) key() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%d|%t", s.Group, s.Generation, s.Rebuild)
	for _, p := range s.Projections {
		b.WriteString("|" + p.Name + "@" + p.Table)
	}
	return b.String()
}

// Admin is what the supervisor asks of Kafka.
type Admin interface {
	// StartOffsets and EndOffsets return each partition's log start and
	// end offsets.
	StartOffsets(ctx context.Context, topic string) (map[int32]int64, error)
	EndOffsets(ctx context.Context, topic string) (map[int32]int64, error)
	// Compacted reports whether the topic's cleanup policy compacts.
	Compacted(ctx context.Context, topic string) (bool, error)
	// DeleteGroup deletes a consumer group; a group that does not exist
	// is not an error.
	DeleteGroup(ctx context.Context, group string) error
}

// Config configures a Supervisor.
type Config struct {
	// Identity is the deployment's consumer identity.
	Identity string
	// Projections are the deployment's, from its projection file: what
	// runs, and how (gap timeout, repair); each one's live generation
	// defines what it writes.
	Projections []*projection.Projection
	Store       *Store
	Admin       Admin
	// NewEngine builds an engine; it creates what the engine writes
	// first when asked (see EngineSpec).
	NewEngine func(EngineSpec) (Engine, error)
	// Migrate creates the table of a generation being built (the
	// projection's Table is its generation's) and checks it.
	Migrate func(ctx context.Context, p *projection.Projection) error
	Logger  *slog.Logger
	Metrics *Metrics
	// AutoRebuild starts a rebuild of each projection whose file
	// definition differs from its live generation's.
	AutoRebuild bool
	// ConfigPath is the projection file, for the rebuild command it
	// logs.
	ConfigPath string
	// Poll is how often the supervisor looks at generations and
	// operations (default DefaultPoll).
	Poll time.Duration
	// Rate is the most records a second a generation being built
	// applies on this replica (0: DefaultRate; negative: unlimited).
	Rate float64
	// LockTimeout bounds each wait of the cutover for a lock (default
	// DefaultLockTimeout); CutoverWait how long it holds the live
	// generation's commits for the new one to reach them (default
	// DefaultCutoverWait).
	LockTimeout time.Duration
	CutoverWait time.Duration
	// CutoverLag is how many records behind the log end every partition
	// of the new generation must be for the cutover to begin (default
	// DefaultCutoverLag); CutoverSeconds how long the rest may take at
	// the rate seen (default DefaultCutoverSeconds).
	CutoverLag     int64
	CutoverSeconds time.Duration
	// Retain is how long a retired generation's table is kept for a
	// rollback (default DefaultRetain).
	Retain time.Duration
	// StopTimeout bounds the stop of an engine the supervisor no longer
	// needs (default 30s).
	StopTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultPoll           = time.Second
	DefaultRate           = 20_000
	DefaultLockTimeout    = 100 * time.Millisecond
	DefaultCutoverWait    = 2 * time.Second
	DefaultCutoverLag     = 1000
	DefaultCutoverSeconds = 10 * time.Second
	DefaultRetain         = 24 * time.Hour
)

func (c *Config) defaults() {
	if c.Poll <= 0 {
		c.Poll = DefaultPoll
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.CutoverWait <= 0 {
		c.CutoverWait = DefaultCutoverWait
	}
	if c.CutoverLag <= 0 {
		c.CutoverLag = DefaultCutoverLag
	}
	if c.CutoverSeconds <= 0 {
		c.CutoverSeconds = DefaultCutoverSeconds
	}
	if c.Retain <= 0 {
		c.Retain = DefaultRetain
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Supervisor runs, on one replica, the engines of a deployment's
// generations: the deployment's identity for projections still at
// generation 1, one engine per later live generation, and one per
// generation being built; and it drives the rebuild operations.
type Supervisor struct {
	cfg  Config
	file map[string]*projection.Projection // by name

	mu      sync.Mutex
	engines map[string]*runningEngine // by spec key
	// samples are the last progress seen of each operation here, for
	// its rates.
	samples map[string]progressSample
	// limiters throttle each generation being built (by group), so that
	// the cutover can lift the throttle without a restart.
	limiters map[string]*rate.Limiter
	failed   map[string]time.Time // engines of generations being built that failed, by key: not restarted before then
}

type runningEngine struct {
	spec   EngineSpec
	e      Engine
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's, once done is closed
}

// New returns a supervisor.
func New(cfg Config) *Supervisor {
	cfg.defaults()
	s := &Supervisor{cfg: cfg, file: map[string]*projection.Projection{}, engines: map[string]*runningEngine{},
		samples: map[string]progressSample{}, limiters: map[string]*rate.Limiter{}, failed: map[string]time.Time{}}
	for _, p := range cfg.Projections {
		s.file[p.Name] = p
	}
	return s
}

// Run records generation 1 of projections new to generations, says (or,
// with AutoRebuild, starts) the rebuild a changed definition needs, then
// runs the engines and drives the operations until ctx ends or a live
// generation's engine fails. It stops every engine before it returns.
func (s *Supervisor) Run(ctx context.Context) error {
	defer s.stopAll()
	err := s.run(ctx)
	if ctx.Err() != nil {
		return nil // stopped: what failed was cut short
	}
	return err
}

func (s *Supervisor) run(ctx context.Context) error {
	var live map[string]Generation
	for {
		var err error
		live, err = s.cfg.Store.Ensure(ctx, s.cfg.Identity, s.cfg.Projections)
		if err == nil {
			break
		}
		if errors.Is(err, projection.ErrNoDefinition) {
			return err
		}
		s.cfg.Logger.Warn("could not record the projections' generations; trying again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.cfg.Poll):
		}
	}
	for _, p := range s.cfg.Projections {
		g, ok := live[p.Name]
		if !ok {
			continue
		}
		def, err := p.Definition()
		if err != nil {
			return err
		}
		if def.Equal(g.Definition) {
			continue
		}
		s.changed(ctx, p, g)
	}
	for {
		active, err := s.step(ctx)
		if err != nil {
			return err
		}
		// An operation in flight is looked at more often: its cutover
		// begins at the check after its generation catches up.
		wait := s.cfg.Poll
		if active {
			wait = min(wait, activePoll)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// changed handles a projection whose file definition differs from its
// live generation's: the live one keeps running as stored.
func (s *Supervisor) changed(ctx context.Context, p *projection.Projection, g Generation) {
	cmd := fmt.Sprintf("projector rebuild start --projection %s --config %s", p.Name, shellQuote(s.cfg.ConfigPath))
	if !s.cfg.AutoRebuild {
		s.cfg.Logger.Warn("the projection file defines the projection otherwise than its live generation, which keeps serving as it was defined; rebuild it to apply the file",
			"projection", p.Name, "generation", g.N, "command", cmd, "or", "restart with --auto-rebuild")
		return
	}
	def, _ := p.Definition()
	op, err := s.cfg.Store.Start(ctx, Request{Identity: s.cfg.Identity, Projection: p.Name, Definition: &def, Actor: "auto-rebuild"})
	var e *Error
	switch {
	case errors.As(err, &e) && e.Code == CodeInFlight:
		s.cfg.Logger.Info("the projection file defines the projection otherwise than its live generation; a rebuild is already in flight", "projection", p.Name, "err", err)
	case err != nil:
		s.cfg.Logger.Error("auto-rebuild: could not start the rebuild", "projection", p.Name, "err", err)
	default:
		s.cfg.Logger.Info("auto-rebuild: started a rebuild for the projection file's definition", "projection", p.Name, "operation_id", op.ID, "generation", op.Generation)
	}
}

// activePoll is how often the supervisor looks while an operation is in
// flight, unless Poll is shorter.
const activePoll = 200 * time.Millisecond

// step looks at generations and operations once: it drives the
// operations, then starts the engines now wanted and stops the others.
// It reports whether an operation is in flight. Only a failure of a live
// generation's engine is returned.
func (s *Supervisor) step(ctx context.Context) (active bool, err error) {
	if err := s.reap(); err != nil {
		return false, err
	}
	gs, err := s.cfg.Store.Generations(ctx, s.cfg.Identity)
	if err != nil {
		s.cfg.Logger.Warn("could not read the generations; trying again", "err", err)
		return false, nil
	}
	ops, err := s.cfg.Store.Operations(ctx, s.cfg.Identity, true)
	if err != nil {
		s.cfg.Logger.Warn("could not read the rebuild operations; trying again", "err", err)
		return false, nil
	}
	for _, op := range ops {
		s.drive(ctx, op, gs)
	}
	cleaned := s.cleanup(ctx)
	if ctx.Err() != nil {
		return false, nil
	}
	if len(ops) > 0 || cleaned {
		// Read again: the operations may have changed them.
		if gs, err = s.cfg.Store.Generations(ctx, s.cfg.Identity); err != nil {
			return false, nil
		}
		if ops, err = s.cfg.Store.Operations(ctx, s.cfg.Identity, true); err != nil {
			return false, nil
		}
	}
	s.forgetSamples(ops)
	s.cfg.Metrics.generations(gs)
	s.cfg.Metrics.operations(ops)
	specs, err := s.wanted(gs, ops)
	if err != nil {
		s.cfg.Logger.Error("could not compile a generation's definition", "err", err)
		return false, nil
	}
	return len(ops) > 0, s.converge(ctx, specs)
}

// forgetSamples drops the progress samples of operations no longer in
// flight.
func (s *Supervisor) forgetSamples(ops []Operation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.samples {
		if !slices.ContainsFunc(ops, func(op Operation) bool { return op.ID == id }) {
			delete(s.samples, id)
		}
	}
}

// wanted returns the engines this replica should run.
func (s *Supervisor) wanted(gs []Generation, ops []Operation) ([]EngineSpec, error) {
	building := map[string]Operation{} // by projection
	for _, op := range ops {
		if op.State == StateRunning || op.State == StateCuttingOver {
			building[op.Projection] = op
		}
	}
	base := EngineSpec{Group: s.cfg.Identity, Generation: 1}
	var out []EngineSpec
	for _, g := range gs {
		file, ok := s.file[g.Projection]
		if !ok {
			continue // not run by this deployment's file
		}
		switch g.State {
		case Live:
			p, err := g.compile(file)
			if err != nil {
				return nil, err
			}
			if g.GroupID == s.cfg.Identity {
				base.Projections = append(base.Projections, p)
			} else {
				out = append(out, EngineSpec{Group: g.GroupID, Generation: g.N, Projections: []*projection.Projection{p}})
			}
		case Building:
			op, ok := building[g.Projection]
			if !ok || op.Generation != g.N {
				continue
			}
			p, err := g.compile(file)
			if err != nil {
				return nil, err
			}
			out = append(out, EngineSpec{Group: g.GroupID, Generation: g.N, Projections: []*projection.Projection{p},
				Rebuild: true, Limiter: s.limiter(g.GroupID, op.State == StateCuttingOver)})
		}
	}
	if len(base.Projections) > 0 {
		// In the file's order, which decides the lanes' order.
		order := map[string]int{}
		for i, p := range s.cfg.Projections {
			order[p.Name] = i
		}
		sort.SliceStable(base.Projections, func(i, j int) bool { return order[base.Projections[i].Name] < order[base.Projections[j].Name] })
		out = append([]EngineSpec{base}, out...)
	}
	return out, nil
}

// compile builds the projection of g, writing its table, run as file
// says.
func (g Generation) compile(file *projection.Projection) (*projection.Projection, error) {
	p, err := g.Definition.Compile(file)
	if err != nil {
		return nil, fmt.Errorf("generation %d of %s: %w", g.N, g.Projection, err)
	}
	p.Table = g.PhysicalTable
	return p, nil
}

// limiter returns the throttle of the generation being built under
// group; lifted once it cuts over.
func (s *Supervisor) limiter(group string, lifted bool) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limiters[group]
	if l == nil {
		limit := rate.Limit(s.cfg.Rate)
		if s.cfg.Rate < 0 {
			limit = rate.Inf
		}
		l = rate.NewLimiter(limit, max(int(s.cfg.Rate), 10_000))
		s.limiters[group] = l
	}
	if lifted {
		l.SetLimit(rate.Inf)
	}
	return l
}

// converge starts the engines of specs not running and stops the
// running ones not in specs.
func (s *Supervisor) converge(ctx context.Context, specs []EngineSpec) error {
	want := map[string]EngineSpec{}
	for _, sp := range specs {
		want[sp.key()] = sp
	}
	s.mu.Lock()
	var stop []*runningEngine
	for k, r := range s.engines {
		if _, ok := want[k]; !ok {
			stop = append(stop, r)
			delete(s.engines, k)
		}
	}
	s.mu.Unlock()
	// Stopped first: a generation's group moves from one engine to
	// another (building to live) under the same identity.
	s.stopEngines(stop)
	for _, k := range slices.Sorted(maps.Keys(want)) {
		sp := want[k]
		s.mu.Lock()
		_, running := s.engines[k]
		until := s.failed[k]
		s.mu.Unlock()
		if running || time.Now().Before(until) {
			continue
		}
		e, err := s.cfg.NewEngine(sp)
		if err != nil {
			// Building one reads Postgres and the registry, which may be
			// restarting: try again rather than end the replica, which
			// stays unready meanwhile.
			pause := 10 * s.cfg.Poll
			if !sp.Rebuild {
				pause = min(pause, 2*time.Second)
			}
			s.cfg.Logger.Error("could not build an engine; trying again", "group", sp.Group, "generation", sp.Generation, "rebuild", sp.Rebuild, "in", pause, "err", err)
			s.mu.Lock()
			s.failed[k] = time.Now().Add(pause)
			s.mu.Unlock()
			continue
		}
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := &runningEngine{spec: sp, e: e, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(r.done)
			r.err = e.Run(rctx)
		}()
		s.mu.Lock()
		s.engines[k] = r
		s.mu.Unlock()
		s.cfg.Logger.Info("engine started", "group", sp.Group, "generation", sp.Generation, "rebuild", sp.Rebuild,
			"projections", names(sp.Projections))
	}
	return nil
}

// reap forgets engines whose Run returned: one of a live generation
// ends the supervisor with its error; one of a generation being built is
// started again after a pause.
func (s *Supervisor) reap() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.engines {
		select {
		case <-r.done:
		default:
			continue
		}
		delete(s.engines, k)
		if !r.spec.Rebuild {
			if r.err == nil {
				r.err = errors.New("stopped")
			}
			return fmt.Errorf("engine of %s: %w", r.spec.Group, r.err)
		}
		s.cfg.Logger.Error("the engine of a generation being built stopped; starting it again", "group", r.spec.Group, "err", r.err)
		s.failed[k] = time.Now().Add(10 * s.cfg.Poll)
	}
	return nil
}

func (s *Supervisor) stopEngines(rs []*runningEngine) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout)
			defer cancel()
			if err := r.e.Stop(ctx); err != nil {
				s.cfg.Logger.Warn("engine did not stop in time", "group", r.spec.Group, "err", err)
			}
			r.cancel()
			<-r.done
			s.cfg.Logger.Info("engine stopped", "group", r.spec.Group, "generation", r.spec.Generation, "rebuild", r.spec.Rebuild)
		})
	}
	wg.Wait()
}

func (s *Supervisor) stopAll() {
	s.mu.Lock()
	rs := slices.Collect(maps.Values(s.engines))
	clear(s.engines)
	s.mu.Unlock()
	s.stopEngines(rs)
}

// Ready reports the readiness of the engines of live generations (a
// generation being built does not decide whether this replica serves).
// Before the first engine runs, it reports "generations" as not ready.
func (s *Supervisor) Ready(ctx context.Context) map[string]error {
	return s.each(ctx, false, func(e Engine) map[string]error { return e.Ready(ctx) })
}

// Live reports the liveness of every engine.
func (s *Supervisor) Live(ctx context.Context) map[string]error {
	return s.each(ctx, true, func(e Engine) map[string]error { return e.Live(ctx) })
}

func (s *Supervisor) each(_ context.Context, all bool, f func(Engine) map[string]error) map[string]error {
	s.mu.Lock()
	rs := slices.Collect(maps.Values(s.engines))
	s.mu.Unlock()
	out := map[string]error{}
	n := 0
	for _, r := range rs {
		if r.spec.Rebuild && !all {
			continue
		}
		n++
		for k, err := range f(r.e) {
			if r.spec.Group != s.cfg.Identity {
				k = r.spec.Group + ": " + k
			}
			out[k] = err
		}
	}
	if n == 0 && !all {
		out["generations"] = errors.New("no engine running yet")
	}
	return out
}

func names(ps []*projection.Projection) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func shellQuote(s string) string {
	if s == "" {
		return "FILE"
	}
	if strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
