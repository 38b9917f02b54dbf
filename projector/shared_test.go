package projector_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// sharedTopic points b at two read models of the demo's stream, the
// demo's fold projection (accounts) and a snapshot projection
// (last_event), both fed by the demo topic.
func (b *bundle) sharedTopic(t *testing.T) {
	t.Helper()
	snaps, err := projection.Parse(demo.SnapshotProjections, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range snaps {
		p.Topic = b.kafka.Topic
	}
	projs := append(b.projs[:1:1], snaps...)
	if err := postgres.Migrate(t.Context(), b.db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	b.projs = projs
}

// sharedEngine is b.engine with each projection decoding into a reader
// schema of its own (the fold reads v1 of the demo's event, the snapshot
// v2), or with both given one decoder when same is set.
func (b *bundle) sharedEngine(t *testing.T, identity string, cfg projector.Config, same bool) *projector.Engine {
	t.Helper()
	files, err := demo.Schemas()
	if err != nil {
		t.Fatal(err)
	}
	v2, err := avro.Parse(files["account_event_v2"])
	if err != nil {
		t.Fatal(err)
	}
	shared := schemas.NewDecoder(b.reg, b.enc.ReaderSchema())
	cfg.Brokers = b.kafka.Addrs()
	cfg.Identity = identity
	cfg.Projections = b.projs
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if cfg.Store == nil {
		cfg.Store = postgres.NewStore(b.db.Pool)
	}
	e, err := projector.New(cfg, func(p *projection.Projection) partition.Decoder {
		switch {
		case same:
			return shared
		case p.Name == demo.SnapshotTable:
			return schemas.NewDecoder(b.reg, v2)
		}
		return schemas.NewDecoder(b.reg, b.enc.ReaderSchema())
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// verifyShared waits until identity has committed b.end, then compares
// both tables with the reference fold of b.records, and each
// projection's parked events and dead letters with what the fold says
// stay parked and are dead-lettered: every record that cannot be
// applied is dead-lettered once for each projection.
func (b *bundle) verifyShared(t *testing.T, identity string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(ctx, b.db.Pool, identity, b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(b.records)
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("fold projection: %v", err)
	}
	if err := demo.VerifySnapshots(ctx, b.db.Pool, exp); err != nil {
		t.Errorf("snapshot projection: %v", err)
	}
	for _, p := range b.projs {
		parked, dead := perProjection(t, b.db.Pool, identity, p.Name)
		if parked != exp.Parked {
			t.Errorf("projection %s: parked events: got %d, want %d", p.Name, parked, exp.Parked)
		}
		if dead != exp.Poison {
			t.Errorf("projection %s: dead letters: got %d, want %d (every poison pill exactly once)", p.Name, dead, exp.Poison)
		}
	}
	// One stored offset per partition fences both tables.
	var rows int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_offsets WHERE identity = $1`, identity).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != len(b.end) {
		t.Errorf("stored offsets: %d rows, want one per partition (%d)", rows, len(b.end))
	}
}

// perProjection counts a projection's parked events and dead letters.
func perProjection(t *testing.T, pool *pgxpool.Pool, identity, name string) (parked, dead int) {
	t.Helper()
	err := pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM projector_parked WHERE identity = $1 AND projection = $2),
		(SELECT count(*) FROM projector_dead_letters WHERE identity = $1 AND projection = $2)`, identity, name).Scan(&parked, &dead)
	if err != nil {
		t.Fatal(err)
	}
	return parked, dead
}

// TestSharedTopicMatchesReferenceFolds feeds a fold and a snapshot
// projection from one topic (duplicates, reordered and missing versions,
// poison pills, tombstones), with a reader schema each and with one
// reader for both, batches committed one by one and many to a
// transaction: both tables equal the reference fold, and each
// projection parks and dead-letters what the fold says.
func TestSharedTopicMatchesReferenceFolds(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.TombstoneEvery = 1500, 4
	for _, same := range []bool{false, true} {
		for _, batch := range []int{0, 50} {
			t.Run(fmt.Sprintf("one reader %v/batches of %d", same, batch), func(t *testing.T) {
				b := faultSetup(t, opts, 4).bundle
				b.sharedTopic(t)
				b.produce(t, b.records)
				reg := prometheus.NewRegistry()
				run(t, b.sharedEngine(t, "shared", projector.Config{Partition: partition.Config{BatchMaxRecords: batch}, Registerer: reg}, same))
				b.verifyShared(t, "shared")
				// Both gates saw the same versions: the metrics, labelled by
				// projection, count the same for each.
				var applied []float64
				for _, p := range b.projs {
					applied = append(applied, sample(t, reg, "projector_records_processed_total", map[string]string{"projection": p.Name, "outcome": "applied"}))
				}
				if applied[0] == 0 || applied[0] != applied[1] {
					t.Errorf("applied records counted by projection %s and %s: %v, want the same, not 0", b.projs[0].Name, b.projs[1].Name, applied)
				}
				// Behind from the start, small batches commit several to
				// a transaction.
				if tx, batches := counter(t, reg, "projector_commit_batches"), histogramSum(t, reg, "projector_commit_batches"); batch > 0 && tx >= batches {
					t.Errorf("%v transactions for %v batches, want several batches to a transaction", tx, batches)
				}
			})
		}
	}
}

// TestSharedTopicRebalances moves the partitions of a topic feeding two
// projections between members while records flow: both tables still equal
// the reference fold (a fold applied twice would show in the balances).
func TestSharedTopicRebalances(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed, opts.TombstoneEvery = 2000, 7, 5
	b := faultSetup(t, opts, 6).bundle
	b.sharedTopic(t)
	cfg := projector.Config{
		Partition:      partition.Config{BatchMaxRecords: 50, BatchMaxWait: 20 * time.Millisecond},
		SessionTimeout: 6 * time.Second,
	}
	stops := map[string]func(){}
	start := func(name string) {
		c := cfg
		c.Registerer = prometheus.NewRegistry()
		stops[name] = run(t, b.sharedEngine(t, "shared-rebalance", c, false))
	}
	chunk := len(b.records) / 4
	steps := []func(){
		func() { start("a") },
		func() { start("b") },
		func() { stops["a"]() },
		func() { stops["b"](); start("c") },
	}
	all := b.records
	for i, step := range steps {
		part := all[i*chunk : min((i+1)*chunk, len(all))]
		if i == len(steps)-1 {
			part = all[i*chunk:]
		}
		b.produce(t, part)
		step()
	}
	b.verifyShared(t, "shared-rebalance")
}

// TestSharedTopicDeadLettersPerProjection sends an event whose row the
// snapshot projection's table refuses (an amount its check constraint
// does not allow), and a record neither can decode. The first is
// dead-lettered for the snapshot projection only and applied by the fold
// projection of the same topic; the second is dead-lettered for each.
// Replayed once the table takes the amount, the first applies in the
// snapshot projection (and is stale in the fold) and its entries are
// resolved; the second, replayed from one projection's entry, fails again
// in both and reopens each projection's entry instead of adding one. It
// runs with the records in one batch, and in batches of two committed
// several to a transaction (whose refused row has the transaction's
// batches applied again one by one).
func TestSharedTopicDeadLettersPerProjection(t *testing.T) {
	for _, batch := range []int{0, 2} {
		t.Run(fmt.Sprintf("batches of %d", batch), func(t *testing.T) { sharedDeadLetters(t, batch) })
	}
}

func sharedDeadLetters(t *testing.T, batch int) {
	b := faultSetup(t, demo.Options{}, 1).bundle
	b.sharedTopic(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE `+demo.SnapshotTable+` ADD CONSTRAINT small CHECK (amount < 1000)`); err != nil {
		t.Fatal(err)
	}
	ev := func(key string, v int64, typ string, amount int64) demo.Record {
		return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v, Type: typ, Owner: "owner of " + key, Amount: amount}}
	}
	b.records = []demo.Record{
		ev("a", 1, "AccountOpened", 0), ev("a", 2, "Deposited", 100_000),
		ev("b", 1, "AccountOpened", 0), ev("b", 2, "Deposited", 7),
		{Key: "c", Tombstone: true},
		{Key: "junk", Poison: "not the wire format", Raw: []byte("junk")},
	}
	b.produce(t, b.records)
	run(t, b.sharedEngine(t, "shared-dlq", projector.Config{Partition: partition.Config{BatchMaxRecords: batch}}, false))
	if err := demo.WaitCommitted(ctx, b.db.Pool, "shared-dlq", b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(b.records)
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("fold projection: %v", err)
	}
	entries := func() map[string][]deadletters.Entry {
		t.Helper()
		dls, err := deadletters.List(ctx, b.db.Pool, deadletters.Filter{Identity: "shared-dlq"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]deadletters.Entry{}
		for _, d := range dls {
			k := d.Projection + "/" + d.Key + "/" + d.ErrorClass
			out[k] = append(out[k], d)
		}
		return out
	}
	rejected, foldJunk, snapJunk := demo.SnapshotTable+"/a/"+sinks.ClassRejected, "accounts/junk/"+sinks.ClassDecode, demo.SnapshotTable+"/junk/"+sinks.ClassDecode
	got := entries()
	// The refused row dead-letters a's events in the batch that wrote it.
	if len(got) != 3 || len(got[rejected]) != 2 || len(got[foldJunk]) != 1 || len(got[snapJunk]) != 1 {
		t.Fatalf("dead letters by projection/key/class: %v; want a's two events for %s only, and the junk record once for each projection", keysOf(got), demo.SnapshotTable)
	}
	var bAmount int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT amount FROM `+demo.SnapshotTable+` WHERE account_id = 'b'`).Scan(&bAmount); err != nil || bAmount != 7 {
		t.Errorf("snapshot of b: amount %d (%v), want 7: the projection's other aggregate applies", bAmount, err)
	}

	if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE `+demo.SnapshotTable+` DROP CONSTRAINT small`); err != nil {
		t.Fatal(err)
	}
	if _, err := dlqpublish.Replay(ctx, b.db.Pool, b.kafkaClient(t), append(got[rejected], got[foldJunk]...), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		var amount, version int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT amount, version FROM `+demo.SnapshotTable+` WHERE account_id = 'a'`).Scan(&amount, &version); err != nil {
			return fmt.Errorf("snapshot of a: %w", err)
		}
		if amount != 100_000 || version != 2 {
			return fmt.Errorf("snapshot of a: amount %d v%d, want 100000 v2", amount, version)
		}
		now := entries()
		for _, d := range now[rejected] {
			if d.Status != deadletters.StatusResolved {
				return fmt.Errorf("replayed dead letter %d of a: %s, want resolved", d.ID, d.Status)
			}
		}
		for _, k := range []string{foldJunk, snapJunk} {
			if len(now[k]) != 1 || now[k][0].Attempts != 2 || now[k][0].Status != deadletters.StatusOpen {
				return fmt.Errorf("dead letters %s after the junk record's replay: %+v, want one, open, with 2 attempts", k, now[k])
			}
		}
		if len(now) != 3 {
			return fmt.Errorf("dead letters %v after the replays, want no new ones", keysOf(now))
		}
		return nil
	})
	// Stale in the fold projection: a's balance is not added twice.
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("fold projection after the replays: %v", err)
	}
}

func keysOf(m map[string][]deadletters.Entry) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}

// sample returns the value of the sample of family name whose labels
// include want (0: none).
func sample(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metrics(t, g, name) {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match == len(want) {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestSharedTopicDeadLetterStorm runs a topic's fold projection as it
// should be beside a snapshot projection whose key field is wrong, so
// that every event would be dead-lettered for the snapshot: each partition
// halts, with neither table written and its one stored offset before the
// batch, and the error line names the snapshot projection. Fixed, both
// tables equal the reference fold.
func TestSharedTopicDeadLetterStorm(t *testing.T) {
	const partitions = 2
	ctx := t.Context()
	f := stormSetup(t, partitions)
	f.sharedTopic(t)
	good := f.projs
	f.projs = append(good[:1:1], withKeyField(good[1:], "type")...)

	var logs logLines
	reg := prometheus.NewRegistry()
	cfg := projector.Config{Partition: fastRetry, Registerer: reg, Logger: logs.logger(slog.LevelInfo)}
	stop := run(t, f.sharedEngine(t, "shared-storm", cfg, false))
	testenv.WaitFor(t, 30*time.Second, func() error {
		if got := counterWith(t, reg, "projector_partition_dead_letter_storm", "class", sinks.ClassKeyMismatch); got != partitions {
			return fmt.Errorf("projector_partition_dead_letter_storm{class=%q} sums to %v, want %d", sinks.ClassKeyMismatch, got, partitions)
		}
		return nil
	})
	var rows, dead int
	if err := f.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM projector_dead_letters)`).Scan(&rows, &dead); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || dead != 0 {
		t.Errorf("while halted: %d rows in the fold projection's table, %d dead letters; want none: the batch commits for both or neither", rows, dead)
	}
	logs.mu.Lock()
	named := 0
	for line := range bytes.Lines(logs.buf.Bytes()) {
		var rec struct{ Level, Msg, Projection string }
		if err := json.Unmarshal(line, &rec); err == nil && rec.Level == slog.LevelError.String() && strings.HasPrefix(rec.Msg, stormHalted) {
			if rec.Projection != demo.SnapshotTable {
				t.Errorf("storm line names projection %q, want %q, whose dead letters they are", rec.Projection, demo.SnapshotTable)
			}
			named++
		}
	}
	logs.mu.Unlock()
	if named == 0 {
		t.Error("no error line says the partitions halted")
	}
	stop()

	f.projs = good
	run(t, f.sharedEngine(t, "shared-storm", projector.Config{}, false))
	f.verifyShared(t, "shared-storm")
}
