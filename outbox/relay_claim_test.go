package outbox_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
)

// appendInShards appends one event each of n aggregates whose shard
// among 16 (as the relay computes it) is in [lo, hi].
func appendInShards(t *testing.T, e *env, prefix string, n int, lo, hi int64) {
	t.Helper()
	rows, err := e.db.Pool.Query(t.Context(), `SELECT id FROM (SELECT $1 || '-' || i AS id FROM generate_series(1, $2 * 4) i) c
		WHERE ((hashtextextended(id, 0) % 16) + 16) % 16 BETWEEN $3 AND $4 LIMIT $2`, prefix, n, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("%d aggregates of shards %d-%d, want %d", len(ids), lo, hi, n)
	}
	for chunk := range slices.Chunk(ids, 1000) {
		var evs []outbox.Event
		for _, id := range chunk {
			ev := event(id, 1)
			ev.Value, ev.Payload = nil, []byte{0, 0, 0, 0, 1}
			evs = append(evs, ev)
		}
		if err := outbox.AppendPool(t.Context(), e.db.Pool, evs...); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClaimReadsOwnShards: while the shards 0-7 lag by 20,000 rows, the
// claim of a relay owning 8-15 reads about what it returns (its own 100
// rows, not the others' backlog), and when its own shards have more than
// a batch, about a batch.
func TestClaimReadsOwnShards(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	appendInShards(t, e, "lag", 20_000, 0, 7)
	appendInShards(t, e, "own", 100, 8, 15)
	owned := []int64{8, 9, 10, 11, 12, 13, 14, 15}

	returned, read, err := outbox.ExplainClaim(ctx, e.db.Pool, outbox.DefaultShards, owned, 500, true)
	if err != nil {
		t.Fatal(err)
	}
	if returned != 100 || read > returned+len(owned) {
		t.Errorf("claim of shards 8-15 with the shard index: %d rows returned, %d read; want 100 returned, at most %d read", returned, read, 100+len(owned))
	}
	// Without the index (a relay's claims until it is built), the claim
	// reads the others' backlog: what the index is for.
	_, readSeq, err := outbox.ExplainClaim(ctx, e.db.Pool, outbox.DefaultShards, owned, 500, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim of 100 rows behind 20,000 of other shards: %d rows read with the shard index, %d without", read, readSeq)

	appendInShards(t, e, "more", 2_000, 8, 15)
	returned, read, err = outbox.ExplainClaim(ctx, e.db.Pool, outbox.DefaultShards, owned, 500, true)
	if err != nil {
		t.Fatal(err)
	}
	if returned != 500 || read > returned+len(owned) {
		t.Errorf("claim of a batch of shards 8-15: %d rows returned, %d read; want 500 returned, at most %d read", returned, read, 500+len(owned))
	}
}

// TestShardIndexMigration: on an outbox without the claim index of the
// relay's shard count (one created by an older version, or another
// count), the relay builds it concurrently and publishes in order
// meanwhile and after.
func TestShardIndexMigration(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	indexValid := func(name string) bool {
		var ok bool
		err := e.db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
			WHERE x.indrelid = 'projector_outbox'::regclass AND i.relname = $1), false)`, name).Scan(&ok)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !indexValid(outbox.ShardIndexName(outbox.DefaultShards)) {
		t.Fatal("a new outbox has no claim index")
	}
	if _, err := e.db.Pool.Exec(ctx, "DROP INDEX "+outbox.ShardIndexName(outbox.DefaultShards)); err != nil {
		t.Fatal(err)
	}
	// An interrupted concurrent build leaves an invalid index behind: it
	// is dropped and built again.
	if _, err := e.db.Pool.Exec(ctx, "CREATE INDEX "+outbox.ShardIndexName(8)+" ON projector_outbox (seq); UPDATE pg_index SET indisvalid = false WHERE indexrelid = '"+outbox.ShardIndexName(8)+"'::regclass"); err != nil {
		t.Fatal(err)
	}
	appendVersions(t, e, 20, 1, 5)
	for i, shards := range []int{outbox.DefaultShards, 8} {
		_, _, stop := e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond, Shards: shards})
		testenv.WaitFor(t, 20*time.Second, testenv.Holds(fmt.Sprintf("the claim index of %d shards built", shards), func() bool {
			return indexValid(outbox.ShardIndexName(shards))
		}))
		appendVersions(t, e, 20, int64(6+i), int64(6+i))
		testenv.WaitFor(t, 20*time.Second, testenv.Holds("all published", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
		stop()
	}
	checkOrder(t, e.readAll(t), 20*7)
}
