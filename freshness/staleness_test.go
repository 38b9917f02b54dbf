package freshness_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// keyOf is a key that Kafka's default partitioner gives partition p of n.
func keyOf(t *testing.T, p int32, n int) string {
	t.Helper()
	for i := range 1000 {
		k := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if freshness.PartitionOf(k, n) == p {
			return k
		}
	}
	t.Fatalf("no key of partition %d", p)
	return ""
}

// TestStalenessOfStoredOffsets: a partition the engine saw caught up
// lately is 0 stale; one last caught up a minute ago is a minute (less
// the tolerance) stale, whoever asks for another partition's key sees
// that one's; a topic whose stored partitions do not say how many it
// has is as stale as its stalest.
func TestStalenessOfStoredOffsets(t *testing.T) {
	// Every call reads the offsets: the test changes them between calls.
	f := start(t, freshness.Config{Tolerance: time.Second, StalenessCache: -1})
	ctx := t.Context()
	if _, err := f.w.Staleness(ctx, "accounts", "a"); err == nil || !strings.Contains(err.Error(), "the engine has not run") {
		t.Fatalf("staleness with no offsets stored: %v, want an error saying the engine has not run", err)
	}
	// Offsets stored under other identities only: the error names them,
	// for an operator who gave the reader another identity than the
	// engine's.
	f.exec(t, `INSERT INTO projector_offsets (identity, topic, partition, next_offset, caught_up_at) VALUES
		('accounts-projector', 'accounts', 0, 10, now()), ('billing', 'accounts', 0, 10, now())`)
	_, err := f.w.Staleness(ctx, "accounts", "a")
	if err == nil || !strings.Contains(err.Error(), `only under "accounts-projector", "billing"`) {
		t.Fatalf("staleness with offsets stored under other identities: %v, want an error naming them", err)
	}
	f.exec(t, `DELETE FROM projector_offsets`)
	if _, err := f.w.Staleness(ctx, "nope", "a"); !errors.Is(err, freshness.ErrUnknownProjection) {
		t.Fatalf("unknown projection: %v", err)
	}
	f.exec(t, `INSERT INTO projector_offsets (identity, topic, partition, next_offset, caught_up_at) VALUES
		('group', 'accounts', 0, 10, now()),
		('group', 'accounts', 1, 10, now() - interval '61 seconds'),
		('group', 'accounts', 2, 10, NULL),
		('other', 'accounts', 0, 10, now() - interval '1 hour')`)
	f.exec(t, `UPDATE projector_offsets SET updated_at = now() - interval '31 seconds' WHERE partition = 2`)
	within := func(key string, want time.Duration) {
		t.Helper()
		got, err := f.w.Staleness(ctx, "accounts", key)
		if err != nil {
			t.Fatal(err)
		}
		if got < want || got > want+5*time.Second {
			t.Fatalf("staleness of %s = %v, want %v (to 5s more)", key, got, want)
		}
	}
	within(keyOf(t, 0, 3), 0)
	within(keyOf(t, 1, 3), time.Minute)
	// Never seen caught up: since its offset was last stored.
	within(keyOf(t, 2, 3), 30*time.Second)

	// Producers that partition otherwise: the stalest stands for any key.
	other, err := freshness.NewWatcher(f.pool, []*projection.Projection{accounts()}, freshness.Config{Identity: "group",
		Tolerance: time.Second, OtherPartitioner: map[string]bool{"accounts": true}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := other.Staleness(ctx, "accounts", keyOf(t, 0, 3)); err != nil || d < time.Minute {
		t.Fatalf("staleness with another partitioner: %v, %v; want the stalest, a minute", d, err)
	}

	// Partitions 0 and 2 of some larger count: the key's partition is not
	// known, the stalest stands for it.
	f.exec(t, `DELETE FROM projector_offsets WHERE partition = 1`)
	within(keyOf(t, 0, 3), 30*time.Second)
}

// A busy API's reads by key share one read of the stored offsets a
// while (Config.StalenessCache) rather than each running a second
// statement; a read older than that is read again.
func TestStalenessReadOnceAWhile(t *testing.T) {
	f := start(t, freshness.Config{Tolerance: time.Second, StalenessCache: time.Hour})
	ctx := t.Context()
	f.exec(t, `INSERT INTO projector_offsets (identity, topic, partition, next_offset, caught_up_at) VALUES
		('group', 'accounts', 0, 10, now())`)
	key := keyOf(t, 0, 1)
	if d, err := f.w.Staleness(ctx, "accounts", key); err != nil || d != 0 {
		t.Fatalf("staleness of a caught-up partition: %v, %v; want 0", d, err)
	}
	f.exec(t, `UPDATE projector_offsets SET caught_up_at = now() - interval '61 seconds'`)
	if d, err := f.w.Staleness(ctx, "accounts", key); err != nil || d != 0 {
		t.Fatalf("staleness within the cache's time: %v, %v; want the first read's 0", d, err)
	}
	fresh := start(t, freshness.Config{Tolerance: time.Second, StalenessCache: time.Millisecond})
	fresh.exec(t, `INSERT INTO projector_offsets (identity, topic, partition, next_offset, caught_up_at) VALUES
		('group', 'accounts', 0, 10, now())`)
	if d, err := fresh.w.Staleness(ctx, "accounts", key); err != nil || d != 0 {
		t.Fatalf("staleness of a caught-up partition: %v, %v; want 0", d, err)
	}
	fresh.exec(t, `UPDATE projector_offsets SET caught_up_at = now() - interval '61 seconds'`)
	testenv.WaitFor(t, 5*time.Second, func() error {
		d, err := fresh.w.Staleness(ctx, "accounts", key)
		if err == nil && d < time.Minute {
			err = fmt.Errorf("staleness %v once the cache's time passed, want a minute", d)
		}
		return err
	})
}
