package projector_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
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
	cfg.Brokers = b.kafka.ListenAddrs()
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
	if err := demo.WaitCommitted(ctx, b.db.Pool, identity, demo.Topic, b.end, nil); err != nil {
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
// does not allow): it is dead-lettered for that projection only, and applied by
// the fold projection of the same topic.
func TestSharedTopicDeadLettersPerProjection(t *testing.T) {
	b := faultSetup(t, demo.Options{}, 1).bundle
	b.sharedTopic(t)
	if _, err := b.db.Pool.Exec(t.Context(), `ALTER TABLE `+demo.SnapshotTable+` ADD CHECK (amount < 1000)`); err != nil {
		t.Fatal(err)
	}
	ev := func(key string, v int64, typ string, amount int64) demo.Record {
		return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v, Type: typ, Owner: "owner of " + key, Amount: amount}}
	}
	b.records = []demo.Record{
		ev("a", 1, "AccountOpened", 0), ev("a", 2, "Deposited", 100_000),
		ev("b", 1, "AccountOpened", 0), ev("b", 2, "Deposited", 7),
		{Key: "c", Tombstone: true},
	}
	b.produce(t, b.records)
	run(t, b.sharedEngine(t, "shared-dlq", projector.Config{}, false))
	ctx := t.Context()
	if err := demo.WaitCommitted(ctx, b.db.Pool, "shared-dlq", demo.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, demo.Fold(b.records)); err != nil {
		t.Errorf("fold projection: %v", err)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT projection, convert_from(record_key, 'UTF8'), error_class FROM projector_dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var p, k, c string
		if err := rows.Scan(&p, &k, &c); err != nil {
			t.Fatal(err)
		}
		got = append(got, p+"/"+k+"/"+c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The refused row dead-letters every event of a's in the batch that
	// wrote it: a's row is not written in the snapshot table.
	for _, g := range got {
		if g != demo.SnapshotTable+"/a/"+sinks.ClassRejected {
			t.Errorf("dead letter %s, want only %s/a/%s", g, demo.SnapshotTable, sinks.ClassRejected)
		}
	}
	if len(got) == 0 {
		t.Fatal("nothing dead-lettered: the snapshot projection wrote an amount its table refuses")
	}
	var bAmount int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT amount FROM `+demo.SnapshotTable+` WHERE account_id = 'b'`).Scan(&bAmount); err != nil {
		t.Fatalf("the snapshot projection's other aggregate: %v", err)
	}
	if bAmount != 7 {
		t.Errorf("snapshot of b: amount %d, want 7", bAmount)
	}
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
