package projector_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// bundle is what an end-to-end test works with.
type bundle struct {
	db      *testenv.DB
	kafka   *testenv.Cluster
	reg     *sr.Client
	enc     *demo.Encoder
	projs   []*projection.Projection
	records []demo.Record
	end     map[int32]int64
}

// setup is a bundle whose generated stream is already produced.
func setup(t *testing.T, opts demo.Options, partitions int) *bundle {
	t.Helper()
	b := faultSetup(t, opts, partitions).bundle
	b.produce(t, b.records)
	return b
}

func (b *bundle) engine(t *testing.T, identity string, cfg projector.Config) *projector.Engine {
	t.Helper()
	cfg.Brokers = b.kafka.Addrs()
	cfg.Identity = identity
	cfg.Projections = b.projs
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	reader := b.enc.ReaderSchema()
	if cfg.Store == nil {
		cfg.Store = postgres.NewStore(b.db.Pool)
	}
	e, err := projector.New(cfg, func(*projection.Projection) partition.Decoder {
		return schemas.NewDecoder(b.reg, reader)
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs e until the returned stop is called; stop waits for Run to end.
func run(t *testing.T, e *projector.Engine) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func (b *bundle) verify(t *testing.T, identity string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(ctx, b.db.Pool, identity, b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(b.records)
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, b.db.Pool, identity, exp)
}

// checkCounts compares the parked events and dead letters with the fold.
func checkCounts(t *testing.T, pool *pgxpool.Pool, identity string, exp demo.Expected) {
	t.Helper()
	ctx := t.Context()
	var parked, dead int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE identity = $1`, identity).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_dead_letters WHERE identity = $1`, identity).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if parked != exp.Parked {
		t.Errorf("parked events: got %d, want %d", parked, exp.Parked)
	}
	if dead != exp.Poison {
		t.Errorf("dead letters: got %d, want %d (every poison pill exactly once)", dead, exp.Poison)
	}
}

func TestEngineMatchesReferenceFold(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 2000
	b := setup(t, opts, 6)
	e := b.engine(t, "it", projector.Config{})
	stop := run(t, e)
	b.verify(t, "it")
	stop()
}

// TestGoFold runs a projection defined in Go, with a Go fold, and compares
// it with the reference fold.
func TestGoFold(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 1000
	b := setup(t, opts, 4)
	p := balances()
	if err := postgres.Migrate(t.Context(), b.db.Pool, p); err != nil {
		t.Fatal(err)
	}
	b.projs = []*projection.Projection{p}
	run(t, b.engine(t, "gofold", projector.Config{}))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(ctx, b.db.Pool, "gofold", b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(b.records)
	got := map[string][3]int64{}
	rows, err := b.db.Pool.Query(ctx, `SELECT account_id, balance, events, version FROM balances`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var bal, events, version int64
		if err := rows.Scan(&id, &bal, &events, &version); err != nil {
			t.Fatal(err)
		}
		got[id] = [3]int64{bal, events, version}
	}
	if len(got) != len(exp.Accounts) {
		t.Errorf("rows: got %d, want %d", len(got), len(exp.Accounts))
	}
	for id, a := range exp.Accounts {
		if want := [3]int64{a.Balance, a.Version, a.Version}; got[id] != want {
			t.Errorf("%s: got balance, events, version %v, want %v", id, got[id], want)
		}
	}
}

// TestSnapshotApplyOverGaps runs a snapshot projection with on_gap apply:
// every account's row must hold its highest version, gaps or not.
func TestSnapshotApplyOverGaps(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.CloseEvery = 1000, 0
	b := setup(t, opts, 4)
	projs, err := projection.Parse([]byte(`
projections:
  - name: last_event
    topic: accounts.events
    table: last_event
    key: account_id
    mode: snapshot
    on_gap: apply
    columns:
      account_id: {type: text, primary_key: true}
      kind:       {type: text, field: type}
      amount:     {type: bigint}
`), ".")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := postgres.Migrate(ctx, b.db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	b.projs = projs
	run(t, b.engine(t, "snap", projector.Config{}))
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, b.db.Pool, "snap", b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	want := map[string]demo.Event{}
	for _, r := range b.records {
		if r.Poison == "" && r.Event.Version > want[r.Key].Version {
			want[r.Key] = r.Event
		}
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT account_id, kind, amount, version FROM last_event`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var (
			id, kind        string
			amount, version int64
		)
		if err := rows.Scan(&id, &kind, &amount, &version); err != nil {
			t.Fatal(err)
		}
		n++
		w := want[id]
		if kind != w.Type || amount != w.Amount || version != w.Version {
			t.Errorf("%s: got %s/%d v%d, want %s/%d v%d", id, kind, amount, version, w.Type, w.Amount, w.Version)
		}
	}
	if n != len(want) {
		t.Errorf("rows: got %d, want %d", n, len(want))
	}
	var parked int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE identity = 'snap'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 0 {
		t.Errorf("on_gap apply parked %d events", parked)
	}
}

// TestAbortedTransactionsNeverApply produces part of the stream inside an
// aborted transaction (events that would change balances) and the rest
// inside a committed one, so every partition ends in a transaction marker:
// the aborted events must never apply and the stored offsets must still
// reach the end of every partition.
func TestAbortedTransactionsNeverApply(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 1000
	b := setup(t, opts, 3)

	txn, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Addrs()...), kgo.TransactionalID(b.kafka.Name("test-txn")))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	inTxn := func(records []demo.Record, commit kgo.TransactionEndTry) {
		t.Helper()
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := demo.Produce(ctx, txn, b.enc, records, nil); err != nil {
			t.Fatal(err)
		}
		if err := txn.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	// Aborted: deposits at every account's next versions, and new accounts.
	var bogus []demo.Record
	exp := demo.Fold(b.records)
	for id, a := range exp.Accounts {
		for v := a.Version + 1; v <= a.Version+3; v++ {
			bogus = append(bogus, demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: v, Type: "Deposited", Amount: 1_000_000}})
		}
	}
	for i := range 50 {
		id := fmt.Sprintf("aborted-%d", i)
		bogus = append(bogus, demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "ghost"}})
	}
	inTxn(bogus, kgo.TryAbort)
	// Committed: more real events, continuing each open account.
	var more []demo.Record
	for id, a := range exp.Accounts {
		ev := demo.Event{AccountID: id, Version: a.Version + 1, Type: "Deposited", Amount: 7}
		more = append(more, demo.Record{Key: id, Event: ev})
	}
	inTxn(more, kgo.TryCommit)
	b.records = append(b.records, more...)
	if b.end, err = demo.EndOffsets(ctx, kadm.NewClient(txn), b.kafka.Topic); err != nil {
		t.Fatal(err)
	}
	run(t, b.engine(t, "txn", projector.Config{}))
	b.verify(t, "txn")
}

// TestTinyBuffersNeverStall runs workers whose buffer holds one batch of
// five records, fetching a few records at a time: fetching of every
// partition pauses after nearly every fetch and resumes as batches drain
// the buffer (data fetched while paused is dropped and fetched again), and
// the stream must still be consumed to its end and equal the reference
// fold. The ordering of a pause against its resume is tested in package
// partition, where it can be forced.
func TestTinyBuffersNeverStall(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 500
	b := setup(t, opts, 6)
	e := b.engine(t, "tiny", projector.Config{
		Partition:  partition.Config{BatchMaxRecords: 5, MaxBuffered: 5, BatchMaxWait: time.Millisecond},
		ClientOpts: []kgo.Opt{kgo.FetchMaxPartitionBytes(1024)},
	})
	stop := run(t, e)
	b.verify(t, "tiny")
	stop()
}

// TestMemberBudgetSharedAmongPartitions bounds the records a member holds
// to 240 over 12 partitions: every worker batches and buffers at most 10
// records instead of its default 2000, and the stream still ends equal to
// the reference fold.
func TestMemberBudgetSharedAmongPartitions(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	b := setup(t, opts, 12)
	reg := prometheus.NewRegistry()
	e := b.engine(t, "budget", projector.Config{MemberMaxRecords: 240, Registerer: reg})
	stop := run(t, e)
	b.verify(t, "budget")
	stop()
	// Batches of 10 take hundreds of commits; unbounded, a partition's few
	// hundred records take one or two.
	batches := counter(t, reg, "projector_batch_records")
	if min := float64(len(b.records)) / 20; batches < min {
		t.Errorf("%.0f batches for %d records: want at least %.0f, batches of at most 10", batches, len(b.records), min)
	}
	if small := bucket(t, reg, "projector_batch_records", 16); small < batches*0.95 {
		t.Errorf("%.0f of %.0f batches hold at most 16 records: want nearly all within the share of 10", small, batches)
	}
}

// TestBehindCommitsSeveralBatches runs a member far behind its stream with
// batches of 100 records: it commits several batches per transaction (the
// rows of an account written once for all of them) and the table ends
// equal to the reference fold, duplicates, reordered and missing versions
// and poison pills included.
func TestBehindCommitsSeveralBatches(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 2000
	b := setup(t, opts, 4)
	reg := prometheus.NewRegistry()
	e := b.engine(t, "behind", projector.Config{Partition: partition.Config{BatchMaxRecords: 100}, Registerer: reg})
	stop := run(t, e)
	b.verify(t, "behind")
	stop()
	commits, batches := counter(t, reg, "projector_commit_batches"), histogramSum(t, reg, "projector_commit_batches")
	if batches < 2*commits {
		t.Errorf("%.0f batches in %.0f transactions: want several batches in most", batches, commits)
	}
	if got := counter(t, reg, "projector_batch_records"); got != batches {
		t.Errorf("%.0f batches observed in projector_batch_records, %.0f in projector_commit_batches", got, batches)
	}
}

// TestBehindReplaysWhenAssumedNewExists restarts a member (its state cache
// empty) behind a stream that re-sends the first events of accounts it
// has applied: the batches holding them plan those accounts as new, the
// transaction covering them finds their rows, and is applied again batch
// by batch; every re-sent event is stale and the table equals the fold.
func TestBehindReplaysWhenAssumedNewExists(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 1000
	opts.Duplicate, opts.Reorder, opts.GapEvery, opts.Poison = 0, 0, 0, 0
	b := faultSetup(t, opts, 2).bundle
	all := b.records
	half := len(all) / 2
	b.produce(t, all[:half])
	e := b.engine(t, "replay", projector.Config{})
	stop := run(t, e)
	b.verifyPart(t, "replay", all[:half])
	stop()

	var resent []demo.Record
	for _, r := range all[:half] {
		if r.Event.Version == 1 {
			resent = append(resent, r)
		}
	}
	rest := append(resent, all[half:]...)
	b.produce(t, rest)
	b.records = append(all[:half:half], rest...)
	reg := prometheus.NewRegistry()
	e = b.engine(t, "replay", projector.Config{Partition: partition.Config{BatchMaxRecords: 100}, Registerer: reg})
	stop = run(t, e)
	b.verify(t, "replay")
	stop()
	if n := counter(t, reg, "projector_commit_replays_total"); n == 0 {
		t.Error("no transaction was applied again batch by batch")
	}
}
