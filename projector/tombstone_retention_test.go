package projector_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// TestTombstoneRetention: a running member prunes the tombstones older
// than the retention, in batches, says so in one line per run that
// pruned any, and counts them; the younger ones stay, so a late copy of
// a deleted aggregate's first event writes no row within the retention.
// Past it, the trade-off the retention makes: such a copy writes the row
// again.
func TestTombstoneRetention(t *testing.T) {
	b := faultSetup(t, demo.Options{}, 1).bundle
	ev := func(key string, v int64, typ string) demo.Record {
		return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v, Type: typ, Owner: "owner of " + key}}
	}
	tomb := func(key string) demo.Record { return demo.Record{Key: key, Tombstone: true} }
	committed := func() {
		t.Helper()
		if err := demo.WaitCommitted(t.Context(), b.db.Pool, "retention", b.kafka.Topic, b.end, nil); err != nil {
			t.Fatal(err)
		}
	}
	tombstones := func() string {
		var keys []string
		if err := b.db.Pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(key ORDER BY key), '{}') FROM projector_tombstones`).Scan(&keys); err != nil {
			t.Fatal(err)
		}
		return strings.Join(keys, ",")
	}
	hasRow := func(key string) bool {
		var n int
		if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM `+demo.Table+` WHERE account_id = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}

	var logs logLines
	reg := prometheus.NewRegistry()
	e := b.engine(t, "retention", projector.Config{Logger: logs.logger(slog.LevelInfo), Registerer: reg})
	if got := fmt.Sprint(projector.TombstoneRetentions(e)); got != "map[accounts:7d]" {
		t.Fatalf("retentions %s, want the default of 7d", got)
	}
	// Pruning runs every 20ms, a statement a tombstone.
	projector.SetTombstonePruning(e, 20*time.Millisecond, 20*time.Millisecond, 1)
	stop := run(t, e)
	b.produce(t, []demo.Record{
		ev("old1", 1, "AccountOpened"), tomb("old1"),
		ev("old2", 1, "AccountOpened"), tomb("old2"),
		ev("young", 1, "AccountOpened"), tomb("young"),
		ev("live", 1, "AccountOpened"),
	})
	committed()
	if got := tombstones(); got != "old1,old2,young" {
		t.Fatalf("tombstones %s, want old1,old2,young", got)
	}

	// Two tombstones age past the retention at once, one is a day old.
	if _, err := b.db.Pool.Exec(t.Context(), `UPDATE projector_tombstones
		SET deleted_at = now() - CASE WHEN key = 'young' THEN interval '1 day' ELSE interval '8 days' END`); err != nil {
		t.Fatal(err)
	}
	// The run has ended once it has counted and logged what it pruned.
	testenv.WaitFor(t, 30*time.Second, func() error {
		if got := tombstones(); got != "young" {
			return fmt.Errorf("tombstones %s, want young", got)
		}
		if got := prunedOf(t, reg, "accounts"); got != 2 {
			return fmt.Errorf("projector_tombstones_pruned_total{projection=accounts} = %v, want 2", got)
		}
		if n := logs.count(t, slog.LevelInfo, "pruned tombstones past their retention"); n == 0 {
			return errors.New("no log line of pruning")
		}
		return nil
	})
	if n := logs.count(t, slog.LevelInfo, "pruned tombstones past their retention"); n != 1 {
		t.Errorf("%d log lines of pruning, want 1 for the run that pruned both (one batch each)", n)
	}

	// Late copies of first events, read by a member whose state cache
	// does not remember the deleted aggregates (a member that does
	// keeps treating them as stale): young's is stale, old1's is a first
	// event again.
	stop()
	run(t, b.engine(t, "retention", projector.Config{}))
	b.produce(t, []demo.Record{ev("young", 1, "AccountOpened"), ev("old1", 1, "AccountOpened")})
	committed()
	if hasRow("young") {
		t.Error("a late copy wrote young's row again within its tombstone's retention")
	}
	if !hasRow("old1") {
		t.Error("a late copy of old1's first event after its tombstone was pruned wrote no row; the retention's trade-off is documented as writing it")
	}
	if !hasRow("live") {
		t.Error("live's row is gone")
	}
}

// prunedOf is projector_tombstones_pruned_total{projection} in reg.
func prunedOf(t *testing.T, reg *prometheus.Registry, projection string) float64 {
	t.Helper()
	const name = "projector_tombstones_pruned_total"
	for _, m := range metrics(t, reg, name) {
		for _, l := range m.GetLabel() {
			if l.GetName() == "projection" && l.GetValue() == projection {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{projection=%q} in the registry", name, projection)
	return 0
}

// TestTombstoneRetentionSettings: a projection's own retention wins over
// the engine's, off keeps a projection's tombstones forever, and the
// counter has each projection's series before anything is pruned.
func TestTombstoneRetentionSettings(t *testing.T) {
	b := faultSetup(t, demo.Options{}, 1).bundle
	reg := prometheus.NewRegistry()
	e := b.engine(t, "settings", projector.Config{TombstoneRetention: 36 * time.Hour, Registerer: reg})
	if got := fmt.Sprint(projector.TombstoneRetentions(e)); got != "map[accounts:36h0m0s]" {
		t.Errorf("with the engine's 36h: %s", got)
	}
	if got := prunedOf(t, reg, "accounts"); got != 0 {
		t.Errorf("projector_tombstones_pruned_total at start = %v, want 0", got)
	}
	b.projs[0].TombstoneRetention = 30 * 24 * time.Hour
	if got := fmt.Sprint(projector.TombstoneRetentions(b.engine(t, "settings", projector.Config{TombstoneRetention: 36 * time.Hour}))); got != "map[accounts:30d]" {
		t.Errorf("with the projection's 30d: %s", got)
	}
	b.projs[0].TombstoneRetention = -1
	if got := fmt.Sprint(projector.TombstoneRetentions(b.engine(t, "settings", projector.Config{}))); got != "map[]" {
		t.Errorf("with the projection's off: %s, want nothing pruned", got)
	}
	b.projs[0].TombstoneRetention = 0
	if got := fmt.Sprint(projector.TombstoneRetentions(b.engine(t, "settings", projector.Config{TombstoneRetention: -1}))); got != "map[]" {
		t.Errorf("with the engine's off: %s, want nothing pruned", got)
	}
}
