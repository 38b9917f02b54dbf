package freshness_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// pipeline is a service writing through the outbox, the relay, the
// engine and a watcher, on one database.
type pipeline struct {
	db    *testenv.DB
	kafka *testenv.Cluster
	reg   *testenv.SchemaRegistry
	enc   *demo.Encoder
	projs []*projection.Projection
	w     *freshness.Watcher
	// polls times the watcher's rounds.
	polls *pollTimer
}

// pollTimer adds up how long the watcher's round statements took.
type pollTimer struct {
	n     atomic.Int64
	nanos atomic.Int64
}

type pollStart struct{}

func (p *pollTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "UNION ALL") {
		return context.WithValue(ctx, pollStart{}, time.Now())
	}
	return ctx
}

func (p *pollTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if began, ok := ctx.Value(pollStart{}).(time.Time); ok {
		p.n.Add(1)
		p.nanos.Add(int64(time.Since(began)))
	}
}

const identity = "accounts-rw"

// watcherApp names the watcher's sessions, for the benchmark to tell
// their work from the engine's.
const watcherApp = "freshness-watcher"

func newPipeline(t testing.TB, partitions int, cfg freshness.Config) *pipeline {
	t.Helper()
	ctx := t.Context()
	pl := &pipeline{db: testenv.NewDB(t), kafka: testenv.NewCluster(t, demo.Topic, partitions), reg: testenv.NewRegistry(t)}
	var err error
	if pl.enc, err = demo.RegisterSchemasFor(ctx, pl.reg.Client, pl.kafka.Topic); err != nil {
		t.Fatal(err)
	}
	if pl.projs, err = projection.Parse(demo.Projections, "."); err != nil {
		t.Fatal(err)
	}
	for _, p := range pl.projs {
		p.Topic = pl.kafka.Topic
	}
	if err := postgres.Migrate(ctx, pl.db.Pool, pl.projs...); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pl.db.Pool); err != nil {
		t.Fatal(err)
	}
	cfg.Identity = identity
	pc, err := pgxpool.ParseConfig(pl.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pl.polls = &pollTimer{}
	pc.ConnConfig.Tracer = pl.polls
	pc.ConnConfig.RuntimeParams["application_name"] = watcherApp
	wpool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	if pl.w, err = freshness.NewWatcher(wpool, pl.projs, cfg); err != nil {
		t.Fatal(err)
	}
	background(t, func(ctx context.Context) (err error) {
		pprof.Do(ctx, pprof.Labels(costLabel, "watcher"), func(ctx context.Context) { err = pl.w.Run(ctx) })
		return err
	})

	producer, err := kgo.NewClient(kgo.SeedBrokers(pl.kafka.Addrs()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	relay, err := outbox.New(pl.db.Pool, outbox.Config{Client: producer, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	background(t, relay.Run)
	return pl
}

func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// background runs run until the test ends, and says if it failed.
func background(t testing.TB, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				t.Errorf("stopped: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// engine starts the engine, and returns what stops it.
func (pl *pipeline) engine(t testing.TB) (stop func()) {
	t.Helper()
	reader := pl.enc.ReaderSchema()
	e, err := projector.New(projector.Config{Brokers: pl.kafka.Addrs(), Identity: identity, Projections: pl.projs,
		Logger: quiet(), Store: postgres.NewStore(pl.db.Pool)}, func(*projection.Projection) partition.Decoder {
		return schemas.NewDecoder(pl.reg.Client, reader)
	})
	if err != nil {
		t.Fatal(err)
	}
	return background(t, e.Run)
}

// write commits version of account key through the outbox, as a service
// would in its own transaction.
func (pl *pipeline) write(ctx context.Context, key string, version int64) error {
	typ := "Deposited"
	if version == 1 {
		typ = "AccountOpened"
	}
	r := demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: version, Type: typ, Owner: "o", Amount: 1, OccurredAt: time.Now()}}
	value, err := pl.enc.Encode(r)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pl.db.Pool, func(tx pgx.Tx) error {
		return outbox.Append(ctx, tx, outbox.Event{AggregateType: "account", AggregateID: key, Version: version, Type: typ,
			Topic: pl.enc.Topic, Payload: value, Source: "/accounts", Time: r.Event.OccurredAt})
	})
}

// TestReadYourWritesThroughOutbox: a service that commits an event
// through the outbox and then waits for the version it wrote always
// reads it, however soon it asks.
func TestReadYourWritesThroughOutbox(t *testing.T) {
	pl := newPipeline(t, 3, freshness.Config{})
	pl.engine(t)
	ctx := t.Context()
	const writers, versions = 4, 50
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 5 {
				key := fmt.Sprintf("acc-%d-%d", i, k)
				for v := int64(1); v <= versions/5; v++ {
					if err := pl.write(ctx, key, v); err != nil {
						t.Error(err)
						return
					}
					r, err := pl.w.WaitVersion(ctx, "accounts", key, "", v, 30*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					if !r.Reached || !r.Found || r.Version != v {
						t.Errorf("%s: wrote version %d, read %+v", key, v, r)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// TestStalenessOfARunningEngine: a partition the engine caught up with
// is 0 stale and stays so while idle (the engine marks it); once the
// engine stops, its staleness grows.
func TestStalenessOfARunningEngine(t *testing.T) {
	defer func(d time.Duration) { partition.CaughtUpEvery = d }(partition.CaughtUpEvery)
	partition.CaughtUpEvery = 20 * time.Millisecond
	const tolerance = 300 * time.Millisecond
	pl := newPipeline(t, 2, freshness.Config{Tolerance: tolerance})
	stop := pl.engine(t)
	ctx := t.Context()
	keys := []string{keyOf(t, 0, 2), keyOf(t, 1, 2)}
	for _, k := range keys {
		if err := pl.write(ctx, k, 1); err != nil {
			t.Fatal(err)
		}
		if r, err := pl.w.WaitVersion(ctx, "accounts", k, "", 1, 30*time.Second); err != nil || !r.Reached {
			t.Fatalf("%s: %+v, %v", k, r, err)
		}
	}
	stale := func(k string) time.Duration {
		t.Helper()
		d, err := pl.w.Staleness(ctx, "accounts", k)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, k := range keys {
		testenv.WaitFor(t, 10*time.Second, testenv.Holds("caught up", func() bool { return stale(k) == 0 }))
	}
	// Idle for several times the tolerance, it stays caught up.
	idle := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Since(idle) < 4*tolerance {
		<-tick.C
		for _, k := range keys {
			if d := stale(k); d != 0 {
				t.Fatalf("%s of an idle caught-up partition: %v stale", k, d)
			}
		}
	}
	stop()
	stopped := time.Now()
	for _, k := range keys {
		testenv.WaitFor(t, 10*time.Second, testenv.Holds("stale once stopped", func() bool { return stale(k) > 0 }))
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("growing", func() bool { return stale(keys[0]) > 2*tolerance }))
	if d := stale(keys[0]); d > time.Since(stopped) {
		t.Fatalf("%v stale, more than the %v since the engine stopped", d, time.Since(stopped))
	}
}
