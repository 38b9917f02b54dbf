package projector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// planWatcher decodes as the projection's decoder does and records the
// highest offset of a record it has decoded: every record decoded belongs
// to a batch being planned or planned already.
type planWatcher struct {
	dec      partition.Decoder
	offsetOf map[string]int64 // by account and version; each is produced once
	max      atomic.Int64
}

func (p *planWatcher) Decode(ctx context.Context, value []byte) (map[string]any, int, error) {
	fields, id, err := p.dec.Decode(ctx, value)
	if err == nil {
		if off, ok := p.offsetOf[fmt.Sprintf("%v/%v", fields["account_id"], fields["version"])]; ok {
			for cur := p.max.Load(); off > cur && !p.max.CompareAndSwap(cur, off); cur = p.max.Load() {
			}
		}
	}
	return fields, id, err
}

// behindAndLocked is a member whose single partition is far behind and
// whose transactions wait on a lock on its table the test holds.
type behindAndLocked struct {
	*bundle
	watch  *planWatcher
	lock   pgx.Tx
	ran    chan error
	signal context.CancelFunc // what SIGTERM does to Run
}

// startBehindAndLocked locks the table (reads go on, so batches are
// planned; writes wait), starts a member of the group protocol with
// shutdownTimeout, and waits until its first transaction waits on the lock.
func startBehindAndLocked(t *testing.T, identity, protocol string, shutdownTimeout time.Duration) *behindAndLocked {
	t.Helper()
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Duplicate, opts.Reorder, opts.GapEvery, opts.Poison = 2000, 0, 0, 0, 0
	s := &behindAndLocked{bundle: setup(t, opts, 1)} // one partition: record i is at offset i
	s.watch = &planWatcher{offsetOf: map[string]int64{}}
	s.watch.max.Store(-1)
	for i, r := range s.records {
		s.watch.offsetOf[r.Key+"/"+strconv.FormatInt(r.Event.Version, 10)] = int64(i)
	}

	locker, err := pgx.Connect(ctx, s.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close(context.Background()) })
	if s.lock, err = locker.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.lock.Exec(ctx, `LOCK TABLE accounts IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}

	reader := s.enc.ReaderSchema()
	e, err := projector.New(projector.Config{
		Brokers: s.kafka.Addrs(), Identity: identity, Projections: s.projs,
		Partition:       partition.Config{BatchMaxRecords: 100, CommitMaxBatches: 5},
		ShutdownTimeout: shutdownTimeout,
		GroupProtocol:   protocol,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Store:           postgres.NewStore(s.db.Pool),
	}, func(*projection.Projection) partition.Decoder {
		s.watch.dec = schemas.NewDecoder(s.reg, reader)
		return s.watch
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, signal := context.WithCancel(ctx)
	t.Cleanup(signal)
	s.signal, s.ran = signal, make(chan error, 1)
	go func() { s.ran <- e.Run(runCtx) }()

	testenv.WaitFor(t, 30*time.Second, func() error {
		var waiting int
		if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass`).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return errors.New("no transaction waits on the locked table yet")
		}
		return nil
	})
	return s
}

// wait waits for Run to return, at most within, and returns how long it
// took since began.
func (s *behindAndLocked) wait(t *testing.T, began time.Time, within time.Duration) time.Duration {
	t.Helper()
	select {
	case err := <-s.ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(within):
		t.Fatalf("Run did not return within %v of the signal", within)
	}
	return time.Since(began)
}

// stored is the partition's stored offset.
func (s *behindAndLocked) stored(t *testing.T, identity string) int64 {
	t.Helper()
	var n int64
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT coalesce(next_offset, 0) FROM projector_offsets WHERE identity = $1 AND topic = $2 AND partition = 0`, identity, demo.Topic).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestShutdownCommitsPlannedBatches stops a member (as on SIGTERM) while
// its partition is far behind and its transactions cannot commit yet (the
// table is locked), under each group protocol: the planned batches must
// still commit once the lock goes, within the shutdown timeout, before the
// member leaves its group. The stored offset then covers every record
// decoded before the signal, the table equals the reference fold of the
// log up to it, and a new member finishes the stream without applying
// anything twice.
func TestShutdownCommitsPlannedBatches(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) { shutdownCommits(t, protocol) })
	}
}

func shutdownCommits(t *testing.T, protocol string) {
	ctx := t.Context()
	const shutdownTimeout = 20 * time.Second
	s := startBehindAndLocked(t, "shutdown", protocol, shutdownTimeout)
	b, watch := s.bundle, s.watch
	planned := watch.max.Load() + 1 // the records of batches planned or being planned
	if planned <= 0 || planned >= b.end[0] {
		t.Fatalf("%d of %d records planned when the member is told to stop: the partition is not behind", planned, b.end[0])
	}
	s.signal()
	began := time.Now()
	if err := s.lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if took := s.wait(t, began, 2*shutdownTimeout); took >= shutdownTimeout {
		t.Errorf("shutdown took %v, the whole timeout: the planned batches were abandoned", took)
	}
	stored := s.stored(t, "shutdown")
	if stored < planned {
		t.Fatalf("stored offset %d after shutdown; the batches planned before it cover records up to %d: they were abandoned and will be read again", stored, planned)
	}
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, demo.Fold(b.records[:stored])); err != nil {
		t.Fatalf("table after shutdown at offset %d: %v", stored, err)
	}

	// The member left its group rather than waiting out its session.
	if n, state := groupMembers(t, b, "shutdown", protocol); n != 0 {
		t.Errorf("group still lists %d members after shutdown (state %s)", n, state)
	}

	run(t, b.engine(t, "shutdown", projector.Config{GroupProtocol: protocol}))
	b.verify(t, "shutdown")
}

// TestShutdownIsBounded stops a member whose planned batches cannot
// commit (the table stays locked): Run abandons them after the shutdown
// timeout rather than hang past the process's grace period, nothing of
// them is written, and a new member applies them once.
func TestShutdownIsBounded(t *testing.T) {
	const shutdownTimeout = time.Second
	s := startBehindAndLocked(t, "bounded", projector.GroupProtocolClassic, shutdownTimeout)
	s.signal()
	began := time.Now()
	if took := s.wait(t, began, 20*time.Second); took < shutdownTimeout {
		t.Errorf("Run returned after %v, before the shutdown timeout of %v, with its transaction still waiting", took, shutdownTimeout)
	}
	if n := s.stored(t, "bounded"); n != 0 {
		t.Errorf("stored offset %d after an abandoned shutdown, want 0", n)
	}
	if err := s.lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	run(t, s.engine(t, "bounded", projector.Config{}))
	s.verify(t, "bounded")
}

// TestShutdownRetriesPlannedBatches stops a member whose planned
// transaction then fails for a transient reason (its connection is
// terminated while it waits on the lock): the member tries it again within
// the shutdown timeout instead of abandoning it, and it commits once the
// lock goes.
func TestShutdownRetriesPlannedBatches(t *testing.T) {
	ctx := t.Context()
	const shutdownTimeout = 20 * time.Second
	s := startBehindAndLocked(t, "drain", projector.GroupProtocolClassic, shutdownTimeout)
	planned := s.watch.max.Load() + 1
	s.signal()
	began := time.Now()
	var pid int32
	if err := s.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass LIMIT 1`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		select {
		case err := <-s.ran:
			s.ran <- err
			t.Fatalf("Run returned (%v) after the transaction failed: the planned batches were abandoned", err)
		default:
		}
		var again int
		if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass AND pid <> $1`, pid).Scan(&again); err != nil {
			return err
		}
		if again == 0 {
			return errors.New("the failed transaction has not been tried again")
		}
		return nil
	})
	if err := s.lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if took := s.wait(t, began, 2*shutdownTimeout); took >= shutdownTimeout {
		t.Errorf("shutdown took %v, the whole timeout", took)
	}
	stored := s.stored(t, "drain")
	if stored < planned {
		t.Fatalf("stored offset %d after shutdown; the batches planned before it cover records up to %d", stored, planned)
	}
	if err := demo.Verify(ctx, s.db.Pool, demo.Table, demo.Fold(s.records[:stored])); err != nil {
		t.Fatalf("table after shutdown at offset %d: %v", stored, err)
	}
}
