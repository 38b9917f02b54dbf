package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// processedDDL is the idempotency table of the hand-written consumers.
const processedDDL = `CREATE TABLE IF NOT EXISTS processed_events (
	topic     text    NOT NULL,
	partition integer NOT NULL,
	"offset"  bigint  NOT NULL,
	PRIMARY KEY (topic, partition, "offset")
)`

// eventTx is the hand-written consumer's unit of work, the same for the
// plain franz-go consumer and the Watermill one: one transaction per
// event that records the event as processed (skipping it when it already
// was) and applies it to the accounts table, the fold written in SQL.
type eventTx struct {
	pool  *pgxpool.Pool
	dec   *schemas.Decoder
	topic string
}

func newEventTx(ctx context.Context, e *runEnv, pool *pgxpool.Pool) (*eventTx, error) {
	projs, err := Projections(ModeEngineFold, e.spec.Topic)
	if err != nil {
		return nil, err
	}
	// The accounts table exactly as the engine would create it, so that
	// demo.Verify reads both the same way.
	if err := postgres.Migrate(ctx, pool, projs...); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, processedDDL); err != nil {
		return nil, err
	}
	reg, err := sr.NewClient(sr.URLs(e.spec.RegistryURL))
	if err != nil {
		return nil, err
	}
	reader, err := ReaderSchema()
	if err != nil {
		return nil, err
	}
	return &eventTx{pool: pool, dec: schemas.NewDecoder(reg, reader), topic: e.spec.Topic}, nil
}

// apply processes one record in its own transaction.
func (x *eventTx) apply(ctx context.Context, partition int32, offset int64, value []byte) error {
	rec, _, err := x.dec.Decode(ctx, value)
	if err != nil {
		return fmt.Errorf("decode offset %d: %w", offset, err)
	}
	id, _ := rec["account_id"].(string)
	version, _ := rec["version"].(int64)
	typ, _ := rec["type"].(string)
	amount, _ := rec["amount"].(int64)
	return pgx.BeginFunc(ctx, x.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO processed_events (topic, partition, "offset") VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
			x.topic, partition, offset)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // seen before: a redelivery
		}
		switch typ {
		case "AccountOpened":
			owner, _ := rec["owner"].(string)
			at, _ := rec["occurred_at"].(time.Time)
			_, err = tx.Exec(ctx, `INSERT INTO accounts (account_id, owner, balance, opened_at, version) VALUES ($1, $2, 0, $3, $4)
				ON CONFLICT (account_id) DO UPDATE SET owner = excluded.owner, opened_at = excluded.opened_at, version = excluded.version`,
				id, owner, at, version)
		case "Deposited":
			_, err = tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2, version = $3 WHERE account_id = $1`, id, amount, version)
		case "Withdrawn":
			_, err = tx.Exec(ctx, `UPDATE accounts SET balance = balance - $2, version = $3 WHERE account_id = $1`, id, amount, version)
		case "AccountClosed":
			_, err = tx.Exec(ctx, `DELETE FROM accounts WHERE account_id = $1`, id)
		default:
			_, err = tx.Exec(ctx, `UPDATE accounts SET version = $2 WHERE account_id = $1`, id, version)
		}
		return err
	})
}

// progress counts, per partition, the next offset after the last event
// committed.
type progress struct {
	mu   sync.Mutex
	next map[int32]int64
	last time.Time
}

func (p *progress) done(partition int32, offset int64) {
	p.mu.Lock()
	if offset+1 > p.next[partition] {
		p.next[partition] = offset + 1
	}
	p.last = time.Now()
	p.mu.Unlock()
}

func (p *progress) snapshot() (map[int32]int64, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int32]int64, len(p.next))
	var n int64
	for k, v := range p.next {
		out[k] = v
		n += v
	}
	return out, n
}

func (p *progress) reached(end map[int32]int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, v := range end {
		if p.next[k] < v {
			return false
		}
	}
	return true
}

// runNaive is the consumer users write by hand: one goroutine per
// partition, each with a franz-go client assigned its partition directly
// (no group), one transaction per event.
func runNaive(ctx context.Context, e *runEnv) error {
	spec := e.spec
	pool, err := openPool(ctx, spec.DatabaseURL, nil, int32(spec.Partitions))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	x, err := newEventTx(ctx, e, pool)
	if err != nil {
		return err
	}
	clients := make([]*kgo.Client, spec.Partitions)
	for p := range clients {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(spec.Brokers...),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{spec.Topic: {int32(p): kgo.NewOffset().AtStart()}}),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		)
		if err != nil {
			return err
		}
		defer cl.Close()
		clients[p] = cl
	}
	if err := e.ready(ctx); err != nil {
		return err
	}
	end := <-e.endOffsets()
	deadline := e.start.Add(spec.TimeLimit)
	runCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	prog := &progress{next: map[int32]int64{}}
	errs := make(chan error, spec.Partitions)
	var wg sync.WaitGroup
	for p, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := int32(p)
			var next int64
			for next < end[part] {
				fetches := cl.PollFetches(runCtx)
				if runCtx.Err() != nil {
					return
				}
				var failed error
				fetches.EachError(func(_ string, _ int32, err error) { failed = err })
				if failed != nil {
					errs <- failed
					return
				}
				for it := fetches.RecordIter(); !it.Done(); {
					r := it.Next()
					if runCtx.Err() != nil {
						return
					}
					// A started transaction completes even past the time
					// limit, so what was counted is what was committed.
					if err := x.apply(context.WithoutCancel(runCtx), r.Partition, r.Offset, r.Value); err != nil {
						errs <- err
						return
					}
					next = r.Offset + 1
					prog.done(r.Partition, r.Offset)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	res := &WorkerResult{}
	var n int64
	res.Committed, n = prog.snapshot()
	res.Events = n
	finished := prog.reached(end)
	res.TimedOut = !finished
	at := prog.last // the last commit; past the time limit, at least the limit
	if !finished && at.Before(deadline) {
		at = deadline
	}
	if at.IsZero() {
		at = time.Now()
	}
	e.finish(res, at)
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	e.report(ctx, res)
	return nil
}
