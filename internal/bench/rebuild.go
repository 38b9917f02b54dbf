package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// Rebuild modes: a rebuild of the fold projection under a new consumer
// identity while the live generation keeps serving, as `projector run`'s
// supervisor drives it.
const (
	// ModeRebuild rebuilds the projection over the whole stream, without
	// a throttle, and measures from the operation's start (running) to its
	// cutover (completed).
	ModeRebuild = "rebuild"
	// ModeRebuildFreshness measures the live generation's freshness at a
	// low load without a rebuild and with one running beside it.
	ModeRebuildFreshness = "rebuild-freshness"
)

// RebuildFreshLoad is the arrival rate of the rebuild-freshness runs, as
// a fraction of the fold engine's measured events/s.
const RebuildFreshLoad = 0.10

// RebuildTable is the projection the rebuild modes rebuild: the demo's
// accounts fold.
const RebuildTable = demo.Table

// rebuiltProjection is the demo's projection with a column added and its
// fold changed (each deposit is also counted): the rebuild a changed
// definition needs.
var rebuiltProjection = strings.NewReplacer(
	"      opened_at:  {type: timestamptz}\n", "      opened_at:  {type: timestamptz}\n      deposits:   {type: bigint, default: 0}\n",
	"Deposited:     {add: {balance: amount}}", "Deposited:     {add: {balance: amount, deposits: {literal: 1}}}",
).Replace(string(demo.Projections))

// RebuildResult is what a rebuild child saw of the rebuild, in seconds
// from the operation's start (state running, as this child first saw it).
type RebuildResult struct {
	// CaughtUpSeconds is when the new generation's engine had committed
	// every partition up to the stream's end; CuttingOverSeconds when the
	// operation moved to cutting over; the window ends at completed.
	CaughtUpSeconds    float64 `json:"caught_up_seconds,omitempty"`
	CuttingOverSeconds float64 `json:"cutting_over_seconds,omitempty"`
	// Conns is the size of the pool the generation being built wrote on;
	// Rate its --rebuild-rate (0: no limit); PollSeconds how often the
	// supervisor looked at the operation.
	Conns       int32   `json:"conns"`
	Rate        int     `json:"rate"`
	PollSeconds float64 `json:"poll_seconds"`
	// Records is how many records the generation being built committed
	// in the window (rebuild-freshness), RecordsPerSec their rate from its
	// first commit; State the operation's state at the window's end.
	Records       int64   `json:"records,omitempty"`
	RecordsPerSec float64 `json:"records_per_sec,omitempty"`
	State         string  `json:"state"`
	// FromNS and ToNS bound the span the rebuild ran beside the live
	// generation (Unix nanoseconds, rebuild-freshness): from its first
	// commit until the window ended, or until it had caught up with the
	// history and was cancelled before its cutover.
	FromNS int64 `json:"from_ns,omitempty"`
	ToNS   int64 `json:"to_ns,omitempty"`
}

// rebuildProjections returns the demo's projection on topic, as its file
// defines it (so that the definition stored for generation 1 names the
// topic), and the definition of its rebuild.
func rebuildProjections(topic string) ([]*projection.Projection, projection.Definition, error) {
	onTopic := func(src string) string {
		return strings.ReplaceAll(src, "topic: "+demo.Topic, "topic: "+topic)
	}
	projs, err := projection.Parse([]byte(onTopic(string(demo.Projections))), ".")
	if err != nil {
		return nil, projection.Definition{}, err
	}
	next, err := projection.Parse([]byte(onTopic(rebuiltProjection)), ".")
	if err != nil {
		return nil, projection.Definition{}, err
	}
	if len(projs) != 1 || len(next) != 1 || projs[0].Topic != topic {
		return nil, projection.Definition{}, fmt.Errorf("the demo's projection file: want one projection on topic %s", topic)
	}
	def, err := next[0].Definition()
	return projs, def, err
}

// rebuildRig is a child's `projector run` for the rebuild modes: the
// supervisor of the deployment's generations with the engines it asks
// for, built as `projector run` builds them, the live ones on pool and
// the one being built on a pool of its own (a quarter of pool's
// connections, at least 2).
type rebuildRig struct {
	spec     WorkerSpec
	pool     *pgxpool.Pool
	rbPool   *pgxpool.Pool
	live, rb *tracer // commits of the live generation, and of the one being built
	store    *rebuild.Store
	sup      *rebuild.Supervisor
	def      projection.Definition
	kcl      *kgo.Client
	fetched  fetchCounter // records the generation being built fetched
	ran      chan error
	stop     context.CancelFunc
}

func newRebuildRig(ctx context.Context, e *runEnv) (*rebuildRig, error) {
	spec := e.spec
	r := &rebuildRig{spec: spec, live: newTracer(spec.CommitLog), rb: newTracer(false), ran: make(chan error, 1)}
	var err error
	if r.pool, err = openPool(ctx, spec.DatabaseURL, r.live, 0); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(spec.DatabaseURL)
	if err != nil {
		r.close()
		return nil, err
	}
	cfg.ConnConfig.Tracer = r.rb
	cfg.MaxConns, cfg.MinConns = max(2, r.pool.Config().MaxConns/4), 0
	if r.rbPool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		r.close()
		return nil, fmt.Errorf("connect the pool of rebuilds: %w", err)
	}
	projs, def, err := rebuildProjections(spec.Topic)
	if err != nil {
		r.close()
		return nil, err
	}
	r.def = def
	if err := rebuild.Migrate(ctx, r.pool); err != nil {
		r.close()
		return nil, err
	}
	if err := postgres.Migrate(ctx, r.pool, projs...); err != nil {
		r.close()
		return nil, err
	}
	reg, err := sr.NewClient(sr.URLs(spec.RegistryURL))
	if err != nil {
		r.close()
		return nil, err
	}
	reader, err := ReaderSchema()
	if err != nil {
		r.close()
		return nil, err
	}
	if r.kcl, err = kgo.NewClient(kgo.SeedBrokers(spec.Brokers...)); err != nil {
		r.close()
		return nil, err
	}
	r.store = rebuild.NewStore(r.pool)
	rate := float64(spec.RebuildRate)
	if rate == 0 {
		rate = -1 // --rebuild-rate 0: no limit, as projector run reads it
	}
	r.sup = rebuild.New(rebuild.Config{
		Identity:    spec.Identity,
		Projections: projs,
		Store:       r.store,
		Admin:       rebuild.KafkaAdmin(kadm.NewClient(r.kcl)),
		NewEngine: func(sp rebuild.EngineSpec) (rebuild.Engine, error) {
			return r.engine(ctx, sp, reg, reader, e)
		},
		Migrate: func(ctx context.Context, p *projection.Projection) error { return postgres.Migrate(ctx, r.pool, p) },
		Logger:  e.log,
		Metrics: rebuild.NewMetrics(nil),
		Rate:    rate,
		Poll:    spec.RebuildPoll,
	})
	rctx, stop := context.WithCancel(ctx)
	r.stop = stop
	go func() { r.ran <- r.sup.Run(rctx) }()
	return r, nil
}

// engine builds the engine the supervisor asks for, as `projector run`
// does: one being built starts from the earliest offset, throttled.
func (r *rebuildRig) engine(ctx context.Context, sp rebuild.EngineSpec, reg *sr.Client, reader avro.Schema, e *runEnv) (rebuild.Engine, error) {
	spec := r.spec
	pool := r.pool
	var opts []kgo.Opt
	pc := partition.Config{
		BatchMaxRecords:  spec.BatchMaxRecords,
		BatchMaxWait:     spec.BatchMaxWait,
		CommitMaxBatches: spec.CommitMaxBatches,
		ClassifyDecode:   projector.ClassifyDecode,
	}
	if sp.Rebuild {
		pool = r.rbPool
		opts = append(opts, kgo.WithHooks(&r.fetched))
		if sp.Limiter != nil {
			pc.Throttle = sp.Limiter
		}
	}
	if err := postgres.Migrate(ctx, pool, sp.Projections...); err != nil {
		return nil, err
	}
	return projector.New(projector.Config{
		Brokers:          spec.Brokers,
		Identity:         sp.Group,
		Projections:      sp.Projections,
		StartFrom:        projector.StartEarliest,
		Partition:        pc,
		MemberMaxRecords: spec.MemberMaxRecords,
		StateCacheRows:   spec.StateCacheRows,
		StateCacheBytes:  spec.StateCacheBytes,
		Logger:           e.log.With("group", sp.Group),
		Registerer:       prometheus.NewRegistry(),
		ClientOpts:       opts,
		Store:            postgres.NewStore(pool),
	}, func(p *projection.Projection) partition.Decoder {
		return schemas.NewDecoder(reg, schemas.Prune(reader, p.ReadFields())) // as projector run
	})
}

func (r *rebuildRig) close() {
	if r.stop != nil {
		r.stop()
		<-r.ran
	}
	if r.kcl != nil {
		r.kcl.Close()
	}
	if r.rbPool != nil {
		r.rbPool.Close()
	}
	if r.pool != nil {
		r.pool.Close()
	}
}

// result is what the rebuild ran with.
func (r *rebuildRig) result() *RebuildResult {
	poll := r.spec.RebuildPoll
	if poll <= 0 {
		poll = rebuild.DefaultPoll
	}
	return &RebuildResult{Conns: r.rbPool.Config().MaxConns, Rate: r.spec.RebuildRate, PollSeconds: poll.Seconds()}
}

// failed returns the supervisor's error if it stopped.
func (r *rebuildRig) failed() error {
	select {
	case err := <-r.ran:
		r.ran <- err
		if err == nil {
			err = errors.New("stopped")
		}
		return fmt.Errorf("supervisor: %w", err)
	default:
		return nil
	}
}

// waitLive waits until the live generation has committed every partition
// up to end, failing when its stored offsets stop moving for stallAfter.
func (r *rebuildRig) waitLive(ctx context.Context, end map[int32]int64) error {
	committed, last := int64(-1), time.Now()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		sum, ok, err := demo.Committed(ctx, r.pool, r.spec.Identity, r.spec.Topic, end)
		if err == nil && ok {
			return nil
		}
		if err == nil && sum != committed {
			committed, last = sum, time.Now()
		}
		if since := time.Since(last); since > stallAfter {
			return fmt.Errorf("the live generation stalled: %d of %d events committed, none for %s", max(committed, 0), total(end), since.Round(time.Second))
		}
		if err := r.failed(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// start starts the rebuild and waits until it runs (the supervisor took
// it from accepted to running); it returns the operation and when this
// child first saw it running.
func (r *rebuildRig) start(ctx context.Context) (rebuild.Operation, time.Time, error) {
	op, err := r.store.Start(ctx, rebuild.Request{Identity: r.spec.Identity, Projection: "accounts", Definition: &r.def, Actor: "projector-bench"})
	if err != nil {
		return op, time.Time{}, fmt.Errorf("start the rebuild: %w", err)
	}
	op, at, err := r.await(ctx, op.ID, time.Minute, rebuild.StateRunning, rebuild.StateCuttingOver, rebuild.StateCompleted)
	return op, at, err
}

// await polls operation id until it is in one of states, and returns it
// with when it was first seen so (within opPoll).
func (r *rebuildRig) await(ctx context.Context, id string, timeout time.Duration, states ...string) (rebuild.Operation, time.Time, error) {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(opPoll)
	defer t.Stop()
	for {
		op, ok, err := r.store.Operation(ctx, id)
		if err != nil {
			return op, time.Time{}, err
		}
		if !ok {
			return op, time.Time{}, fmt.Errorf("rebuild operation %s: gone", id)
		}
		for _, s := range states {
			if op.State == s {
				return op, time.Now(), nil
			}
		}
		if op.Done() {
			why := ""
			if op.Error != nil {
				why = ": " + op.Error.Code + ": " + op.Error.Message
			}
			return op, time.Time{}, fmt.Errorf("rebuild operation %s ended %s%s", id, op.State, why)
		}
		if time.Now().After(deadline) {
			return op, time.Time{}, fmt.Errorf("rebuild operation %s still %s after %s (%s)", id, op.State, timeout, op.Waiting)
		}
		if err := r.failed(); err != nil {
			return op, time.Time{}, err
		}
		select {
		case <-ctx.Done():
			return op, time.Time{}, ctx.Err()
		case <-t.C:
		}
	}
}

// opPoll is how often a child reads the operation: the bound on the error
// of the times it reports.
const opPoll = 10 * time.Millisecond

// runRebuild is the rebuild child: the live generation consumes the
// whole stream first (not measured); then, in the window, it starts the
// rebuild and follows it until the cutover completes.
func runRebuild(ctx context.Context, e *runEnv) error {
	r, err := newRebuildRig(ctx, e)
	if err != nil {
		return err
	}
	defer r.close()
	end := e.spec.End
	if err := r.waitLive(ctx, end); err != nil {
		return err
	}
	if err := e.ready(ctx); err != nil {
		return err
	}
	op, running, err := r.start(ctx)
	if err != nil {
		return err
	}
	e.s.send(wireMsg{Event: "started"})
	res := &WorkerResult{Rebuild: r.result()}
	var cutting, caught time.Time
	t := time.NewTicker(opPoll)
	defer t.Stop()
	progress, last := int64(-1), time.Now()
	for op.State != rebuild.StateCompleted {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		var ok bool
		if op, ok, err = r.store.Operation(ctx, op.ID); err != nil || !ok {
			return fmt.Errorf("read rebuild operation %s: %v", op.ID, err)
		}
		now := time.Now()
		if op.State == rebuild.StateCuttingOver && cutting.IsZero() {
			cutting = now
		}
		if op.State == rebuild.StateCompleted && cutting.IsZero() {
			cutting = now
		}
		if caught.IsZero() {
			if ok, at := r.rb.reached(end); ok {
				caught = at
			}
		}
		if op.Done() && op.State != rebuild.StateCompleted {
			why := ""
			if op.Error != nil {
				why = ": " + op.Error.Code + ": " + op.Error.Message
			}
			return fmt.Errorf("rebuild operation %s ended %s%s", op.ID, op.State, why)
		}
		if op.RecordsDone != progress {
			progress, last = op.RecordsDone, now
		}
		if since := now.Sub(last); since > stallAfter {
			return fmt.Errorf("rebuild stalled: %d of %d records done, none for %s (%s: %s)", op.RecordsDone, total(end), since.Round(time.Second), op.State, op.Waiting)
		}
		if err := r.failed(); err != nil {
			return err
		}
	}
	done := time.Now()
	e.finish(res, done)
	res.Seconds = done.Sub(running).Seconds()
	rr := res.Rebuild
	rr.CuttingOverSeconds = cutting.Sub(running).Seconds()
	if !caught.IsZero() {
		rr.CaughtUpSeconds = caught.Sub(running).Seconds()
	}
	rr.State = op.State
	res.Events = total(end)
	rows, phases, _ := r.rb.result()
	res.RowWrites, res.Phases = rows, &phases
	res.Fetched = r.fetched.records.Load()
	res.Committed = end
	e.report(ctx, res)
	return nil
}

// runRebuildFreshness is the rebuild-freshness child: the live generation
// consumes the topic's history first (not measured); in the window,
// with spec.Rebuild, it starts a rebuild and, once that applies records,
// tells the parent to produce; it reports the live generation's commits
// of what the parent produced.
func runRebuildFreshness(ctx context.Context, e *runEnv) error {
	r, err := newRebuildRig(ctx, e)
	if err != nil {
		return err
	}
	defer r.close()
	history := e.spec.HistoryEnd
	if err := r.waitLive(ctx, history); err != nil {
		return err
	}
	if err := e.ready(ctx); err != nil {
		return err
	}
	res := &WorkerResult{}
	var (
		op     rebuild.Operation
		rb0    int64
		rbFrom time.Time
	)
	if e.spec.Rebuild {
		res.Rebuild = r.result()
		if op, _, err = r.start(ctx); err != nil {
			return err
		}
		// Produce once the new generation applies records, so that the
		// whole window has the rebuild running beside the live one.
		deadline := time.Now().Add(2 * time.Minute)
		for r.rb.sum() == 0 {
			if time.Now().After(deadline) {
				return errors.New("the generation being built committed nothing within 2 minutes of its start")
			}
			if err := r.failed(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(opPoll):
			}
		}
		rb0, rbFrom = r.rb.sum(), time.Now()
	}
	// The rebuild runs beside the live generation until it has caught up
	// with the history: it is cancelled then, before its cutover would
	// make it the live generation in the middle of the window. The span it
	// ran beside the live one is what the parent measures.
	besideDone := make(chan struct{})
	var rbTo time.Time
	var cancelErr error
	stopBeside := make(chan struct{})
	go func() {
		defer close(besideDone)
		if !e.spec.Rebuild {
			return
		}
		t := time.NewTicker(opPoll)
		defer t.Stop()
		for {
			select {
			case <-stopBeside:
				rbTo = time.Now()
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if r.rb.behind(history) > 2*rebuild.DefaultCutoverLag {
				continue
			}
			rbTo = time.Now()
			if _, err := r.store.Cancel(ctx, op.ID, "projector-bench"); err != nil {
				cancelErr = fmt.Errorf("cancel the rebuild once it caught up with the history, before its cutover: %w", err)
			}
			return
		}
	}()
	e.s.send(wireMsg{Event: "started"})
	var end map[int32]int64
	select {
	case end = <-e.endOffsets():
	case <-ctx.Done():
		return ctx.Err()
	}
	var doneAt time.Time
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	progress, last := int64(-1), time.Now()
	for {
		if ok, at := r.live.reached(end); ok {
			doneAt = at
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.live.notify:
		case <-poll.C:
			sum, _, err := demo.Committed(ctx, r.pool, e.spec.Identity, e.spec.Topic, end)
			if err == nil && sum != progress {
				progress, last = sum, time.Now()
			}
			if since := time.Since(last); since > stallAfter {
				return fmt.Errorf("the live generation stalled: %d of %d events committed, none for %s", max(progress, 0), total(end), since.Round(time.Second))
			}
			if err := r.failed(); err != nil {
				return err
			}
		}
	}
	e.finish(res, doneAt)
	close(stopBeside)
	<-besideDone
	if cancelErr != nil {
		return cancelErr
	}
	if e.spec.Rebuild {
		rr := res.Rebuild
		rr.Records = r.rb.sum() - rb0
		if op, _, err = r.store.Operation(ctx, op.ID); err != nil {
			return err
		}
		rr.RecordsPerSec = float64(rr.Records) / max(rbTo.Sub(rbFrom).Seconds(), 1e-9)
		rr.State = op.State
		rr.FromNS, rr.ToNS = rbFrom.UnixNano(), rbTo.UnixNano()
		if op.State != rebuild.StateRunning && op.State != rebuild.StateCancelled {
			return fmt.Errorf("the rebuild was %s before the window ended: it must not cut over while the live generation's freshness is measured", op.State)
		}
	}
	res.Events = total(end) - total(history)
	rows, phases, commits := r.live.result()
	res.RowWrites, res.Phases = rows, &phases
	// The commits of the window: those of the history are not measured.
	for _, c := range commits {
		if c.To > history[c.Partition] {
			res.Commits = append(res.Commits, c)
		}
	}
	res.Committed = end
	e.report(ctx, res)
	return nil
}

// sum is how many records the traced engine has committed, over all
// partitions.
func (t *tracer) sum() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for _, o := range t.committed {
		n += o
	}
	return n
}

// verifyRebuilt checks a rebuild's result: the projection's name is now a
// view of the new generation, whose table equals the reference fold under
// the rebuilt definition (the demo's columns, and deposits counted).
func verifyRebuilt(ctx context.Context, pool *pgxpool.Pool, exp demo.Expected) error {
	var kind string
	if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`, RebuildTable).Scan(&kind); err != nil {
		return err
	}
	if kind != "v" {
		return fmt.Errorf("%s is not the view of the new generation (relkind %q): the rebuild did not cut over", RebuildTable, kind)
	}
	if err := demo.Verify(ctx, pool, RebuildTable, exp); err != nil {
		return err
	}
	rows, err := pool.Query(ctx, `SELECT account_id, deposits FROM `+RebuildTable)
	if err != nil {
		return err
	}
	defer rows.Close()
	var diffs []string
	n := 0
	for rows.Next() {
		var id string
		var deposits int64
		if err := rows.Scan(&id, &deposits); err != nil {
			return err
		}
		if want := exp.Accounts[id].Deposits; deposits != want {
			n++
			if len(diffs) < 5 {
				diffs = append(diffs, fmt.Sprintf("%s: %d deposits, want %d", id, deposits, want))
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d accounts' deposits differ from the reference fold: %s", n, strings.Join(diffs, "; "))
	}
	return checkEngineTables(ctx, pool)
}

// behind is how many records the traced engine is behind end on the
// partition it is furthest behind.
func (t *tracer) behind(end map[int32]int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var most int64
	for p, e := range end {
		most = max(most, e-t.committed[p])
	}
	return most
}
