package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// projectionModes are the two modes every tombstone test runs in: the
// demo's fold projection, and a snapshot projection of the same stream.
var projectionModes = []string{"fold", "snapshot"}

// useMode points b at the projection of mode.
func (b *bundle) useMode(t *testing.T, mode string) {
	t.Helper()
	if mode == "fold" {
		return // faultSetup migrated the demo's fold projection
	}
	projs, err := projection.Parse(demo.SnapshotProjections, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range projs {
		p.Topic = b.kafka.Topic
	}
	if err := postgres.Migrate(t.Context(), b.db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	b.projs = projs
}

// verifyMode waits until the member of identity has committed b.end and
// compares the projection's table, its parked events and its dead letters
// with the reference fold of b.records.
func (b *bundle) verifyMode(t *testing.T, identity, mode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(ctx, b.db.Pool, identity, b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(b.records)
	var err error
	if mode == "fold" {
		err = demo.Verify(ctx, b.db.Pool, demo.Table, exp)
	} else {
		err = demo.VerifySnapshots(ctx, b.db.Pool, exp)
	}
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, b.db.Pool, identity, exp)
}

// deadLetterClasses returns the error class of each dead letter, by the
// record key it carries.
func deadLetterClasses(t *testing.T, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT coalesce(convert_from(record_key, 'UTF8'), ''), error_class FROM projector_dead_letters ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var key, class string
		if err := rows.Scan(&key, &class); err != nil {
			t.Fatal(err)
		}
		out[key] = append(out[key], class)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTombstones sends null-value records through the broker to a
// single-partition topic, each group of records produced together so that
// it is one batch: a tombstone in the batch of its aggregate's events and
// in a later one, a late copy of a version after its delete, a tombstone
// of an aggregate that never existed, and one without a key. It restarts
// the member (its state cache empty) and sends late copies again. After
// each step the table equals the reference fold, in fold and in snapshot
// mode.
func TestTombstones(t *testing.T) {
	for _, mode := range projectionModes {
		t.Run(mode, func(t *testing.T) {
			b := faultSetup(t, demo.Options{}, 1).bundle
			b.useMode(t, mode)
			ev := func(key string, v int64, typ string, amount int64) demo.Record {
				return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v, Type: typ, Owner: "owner of " + key, Amount: amount}}
			}
			tomb := func(key string) demo.Record { return demo.Record{Key: key, Tombstone: true} }
			step := func(identity string, records ...demo.Record) {
				t.Helper()
				b.produce(t, records)
				b.records = append(b.records, records...)
				b.verifyMode(t, identity, mode)
			}

			stop := run(t, b.engine(t, "tombstones", projector.Config{}))
			step("tombstones",
				ev("b", 1, "AccountOpened", 0), ev("", 1, "AccountOpened", 0), tomb("b"),
				ev("c", 1, "AccountOpened", 0), tomb("c"),
				ev("d", 1, "AccountOpened", 0),
				ev("e", 1, "AccountOpened", 0), ev("e", 2, "Deposited", 20),
				tomb("never-seen"),
				tomb(""), // without a key: dead-lettered
			)
			step("tombstones",
				tomb("d"),
				// A late copy: c's row stays deleted.
				ev("c", 1, "AccountOpened", 0),
				// After its tombstone, e's v1 is stale and v3 builds a new row.
				tomb("e"), ev("e", 1, "AccountOpened", 0), ev("e", 3, "Deposited", 30),
			)
			stop()
			run(t, b.engine(t, "tombstones", projector.Config{}))
			step("tombstones", ev("d", 1, "AccountOpened", 0), ev("b", 1, "AccountOpened", 0), ev("e", 2, "Deposited", 20))

			for _, key := range []string{"b", "c", "d"} {
				var n int
				if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM `+b.projs[0].Table+` WHERE account_id = $1`, key).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("%q has a row after its tombstone", key)
				}
			}
			if got, want := deadLetterClasses(t, b.db.Pool), map[string][]string{"": {sinks.ClassInvalid}}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("dead letters by key and class: %v, want %v (the tombstone without a key)", got, want)
			}
		})
	}
}

// TestTombstonesInAStream mixes tombstones into the generated stream
// (duplicates, reordered and missing versions, poison pills): tombstones
// after any of an account's events, late copies after them, tombstones of
// accounts that never existed and some without a key. The table equals
// the reference fold in fold and snapshot mode, with batches committed one
// by one and several to a transaction.
func TestTombstonesInAStream(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.TombstoneEvery = 600, 3
	for _, mode := range projectionModes {
		for _, batch := range []int{0, 50} {
			t.Run(fmt.Sprintf("%s/batches of %d", mode, batch), func(t *testing.T) {
				b := setup(t, opts, 3)
				b.useMode(t, mode)
				run(t, b.engine(t, "stream", projector.Config{Partition: partition.Config{BatchMaxRecords: batch}}))
				b.verifyMode(t, "stream", mode)
			})
		}
	}
}
