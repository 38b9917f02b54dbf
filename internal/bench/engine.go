package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// SnapshotTable is the snapshot projection's table: the last event of
// every account.
const SnapshotTable = "last_event"

// snapshotProjection keeps the last event of every account (snapshot
// mode): one row write per batch and aggregate, whatever the event type.
const snapshotProjection = `
projections:
  - name: last_event
    topic: TOPIC
    table: last_event
    key: account_id
    mode: snapshot
    columns:
      account_id:  {type: text, primary_key: true}
      kind:        {type: text, field: type}
      amount:      {type: bigint}
      occurred_at: {type: timestamptz}
`

// Projections returns the projection a mode runs, on topic: the demo's
// accounts fold (table accounts), or the last-event snapshot.
func Projections(mode, topic string) ([]*projection.Projection, error) {
	var src []byte
	switch mode {
	case ModeEngineSnapshot:
		src = []byte(strings.Replace(snapshotProjection, "TOPIC", topic, 1))
	default:
		src = demo.Projections
	}
	projs, err := projection.Parse(src, ".")
	if err != nil {
		return nil, err
	}
	for _, p := range projs {
		p.Topic = topic
	}
	return projs, nil
}

// ReaderSchema is the schema the projections read with: the demo's v1
// AccountEvent.
func ReaderSchema() (avro.Schema, error) {
	files, err := demo.Schemas()
	if err != nil {
		return nil, err
	}
	return avro.ParseWithCache(files["account_event"], "", &avro.SchemaCache{})
}

// openPool connects like `projector run` does (pgxpool defaults unless the
// URL says otherwise), with t tracing when not nil and at least minConns
// connections allowed.
func openPool(ctx context.Context, url string, t *tracer, minConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if t != nil {
		cfg.ConnConfig.Tracer = t
	}
	if cfg.MaxConns < minConns {
		cfg.MaxConns = minConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// runEngine runs projector end to end in this process: the engine consumes
// the topic from the start, decodes through the registry, gates versions
// and commits set-based batches with the fenced offset, until every
// partition has committed up to its end offset.
func runEngine(ctx context.Context, e *runEnv) error {
	spec := e.spec
	tr := newTracer(spec.CommitLog)
	pool, err := openPool(ctx, spec.DatabaseURL, tr, 0)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	projs, err := Projections(spec.Mode, spec.Topic)
	if err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, pool, projs...); err != nil {
		return err
	}
	reg, err := sr.NewClient(sr.URLs(spec.RegistryURL))
	if err != nil {
		return err
	}
	reader, err := ReaderSchema()
	if err != nil {
		return err
	}
	var fetched fetchCounter
	eng, err := projector.New(projector.Config{
		Brokers:     spec.Brokers,
		Identity:    spec.Identity,
		Projections: projs,
		Partition: partition.Config{
			BatchMaxRecords:  spec.BatchMaxRecords,
			BatchMaxWait:     spec.BatchMaxWait,
			CommitMaxBatches: spec.CommitMaxBatches,
			ClassifyDecode:   projector.ClassifyDecode,
		},
		MemberMaxRecords: spec.MemberMaxRecords,
		StateCacheRows:   spec.StateCacheRows,
		StateCacheBytes:  spec.StateCacheBytes,
		Logger:           e.log,
		Registerer:       prometheus.NewRegistry(),
		ClientOpts:       []kgo.Opt{kgo.WithHooks(&fetched)},
		Store:            postgres.NewStore(pool),
	}, func(p *projection.Projection) partition.Decoder {
		return schemas.NewDecoder(reg, schemas.Prune(reader, p.ReadFields())) // as projector run
	})
	if err != nil {
		return err
	}
	if err := e.ready(ctx); err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- eng.Run(runCtx) }()

	res := &WorkerResult{}
	joined := make(chan time.Duration, 1)
	go func() {
		for runCtx.Err() == nil {
			if len(eng.Workers()) >= spec.Partitions {
				joined <- time.Since(e.start)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	// Done when every partition has committed up to its end offset: seen
	// exactly through the tracer; a poll of the stored offsets backs it up
	// should the engine's statements ever stop matching the tracer.
	var (
		end    map[int32]int64
		endC   = e.endOffsets()
		doneAt time.Time
		poll   = time.NewTicker(250 * time.Millisecond)
		// A run whose stored offsets stop moving fails rather than
		// hangs: a stalled partition is a bug the benchmark must report.
		committed    int64 = -1
		lastProgress       = time.Now()
	)
	defer poll.Stop()
	for doneAt.IsZero() {
		select {
		case end = <-endC:
			endC = nil
		case <-tr.notify:
		case <-poll.C:
			if end != nil {
				sum, ok, err := demo.Committed(ctx, pool, spec.Identity, spec.Topic, end)
				if err == nil && sum != committed {
					committed, lastProgress = sum, time.Now()
				}
				if since := time.Since(lastProgress); !ok && since > stallAfter {
					return fmt.Errorf("engine stalled: %d of %d events committed, none for %s", max(committed, 0), total(end), since.Round(time.Second))
				}
				if err == nil && ok {
					if ok, at := tr.reached(end); ok {
						doneAt = at
					} else {
						doneAt = time.Now()
					}
				}
			}
		case d := <-joined:
			res.JoinSeconds = d.Seconds()
			e.s.send(wireMsg{Event: "started"})
		case err := <-ran:
			return fmt.Errorf("engine stopped before it caught up: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		}
		if end != nil && doneAt.IsZero() {
			if ok, at := tr.reached(end); ok {
				doneAt = at
			}
		}
	}
	e.finish(res, doneAt)
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("engine: %w", err)
	}
	res.Events = total(end)
	rows, phases, commits := tr.result()
	res.RowWrites, res.Phases, res.Commits = rows, &phases, commits
	res.Fetched = fetched.records.Load()
	res.Committed = end
	e.report(ctx, res)
	return nil
}

// stallAfter is how long an engine run may commit nothing before it fails.
const stallAfter = 60 * time.Second

// total is the number of events before the end offsets.
func total(end map[int32]int64) int64 {
	var n int64
	for _, o := range end {
		n += o
	}
	return n
}

// fetchCounter counts the records the Kafka client decoded from fetch
// responses: more than the events consumed means data fetched twice (a
// partition paused with a fetch in flight has that data dropped).
type fetchCounter struct{ records atomic.Int64 }

func (f *fetchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.records.Add(int64(m.NumRecords))
}
