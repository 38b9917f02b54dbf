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
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
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

// TestShutdownCommitsPlannedBatches stops a member (as on SIGTERM) while
// its partition is far behind and its transactions cannot commit yet (the
// table is locked): the planned batches must still commit once the lock
// goes, within the shutdown timeout, before the member leaves its group.
// The stored offset then covers every record decoded before the signal,
// the table equals the reference fold of the log up to it, and a new
// member finishes the stream without applying anything twice.
func TestShutdownCommitsPlannedBatches(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Duplicate, opts.Reorder, opts.GapEvery, opts.Poison = 2000, 0, 0, 0, 0
	b := setup(t, opts, 1) // one partition: record i is at offset i
	watch := &planWatcher{offsetOf: map[string]int64{}}
	watch.max.Store(-1)
	for i, r := range b.records {
		watch.offsetOf[r.Key+"/"+strconv.FormatInt(r.Event.Version, 10)] = int64(i)
	}

	locker, err := pgx.Connect(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	lock, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Reads go on (batches are planned), writes wait.
	if _, err := lock.Exec(ctx, `LOCK TABLE accounts IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}

	const shutdownTimeout = 20 * time.Second
	reader := b.enc.ReaderSchema()
	e, err := projector.New(projector.Config{
		Brokers: b.kafka.ListenAddrs(), Identity: "shutdown", Projections: b.projs,
		Partition:       partition.Config{BatchMaxRecords: 100, CommitMaxBatches: 5},
		ShutdownTimeout: shutdownTimeout,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, b.db.Pool, func(*projection.Projection) partition.Decoder {
		watch.dec = schemas.NewDecoder(b.reg, reader)
		return watch
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, signal := context.WithCancel(ctx)
	defer signal()
	ran := make(chan error, 1)
	go func() { ran <- e.Run(runCtx) }()

	testenv.WaitFor(t, 30*time.Second, func() error {
		var waiting int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass`).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return errors.New("no transaction waits on the locked table yet")
		}
		return nil
	})
	planned := watch.max.Load() + 1 // the records of batches planned or being planned
	if planned <= 0 || planned >= b.end[0] {
		t.Fatalf("%d of %d records planned when the member is told to stop: the partition is not behind", planned, b.end[0])
	}
	signal()
	began := time.Now()
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(2 * shutdownTimeout):
		t.Fatalf("Run did not return within twice its shutdown timeout")
	}
	if took := time.Since(began); took >= shutdownTimeout {
		t.Errorf("shutdown took %v, the whole timeout: the planned batches were abandoned", took)
	}

	var stored int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT coalesce(next_offset, 0) FROM projector_offsets WHERE identity = 'shutdown' AND topic = $1 AND partition = 0`, demo.Topic).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored < planned {
		t.Fatalf("stored offset %d after shutdown; the batches planned before it cover records up to %d: they were abandoned and will be read again", stored, planned)
	}
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, demo.Fold(b.records[:stored])); err != nil {
		t.Fatalf("table after shutdown at offset %d: %v", stored, err)
	}

	// The member left its group rather than waiting out its session.
	adm, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	groups, err := kadm.NewClient(adm).DescribeGroups(ctx, "shutdown")
	if err != nil {
		t.Fatal(err)
	}
	if g := groups["shutdown"]; len(g.Members) != 0 {
		t.Errorf("group still lists %d members after shutdown (state %s)", len(g.Members), g.State)
	}

	run(t, b.engine(t, "shutdown", projector.Config{}))
	b.verify(t, "shutdown")
}
