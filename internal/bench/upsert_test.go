package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks/postgres"
)

// The upsert peer has no gap handling, so where its table differs from the
// reference fold the row says by how many accounts, in the table and in
// JSON, and the run does not fail; an engine row that differs still fails
// it. The engine's ratio to the peer is shown, and said to be slower when
// it is.
func TestUpsertPeerMismatchesAreCounted(t *testing.T) {
	sample := func(mode string, eps float64, check error) []*Sample {
		return []*Sample{{Mode: mode, Result: WorkerResult{Events: 1000, Seconds: 1000 / eps, RowWrites: 200}, Check: check}}
	}
	r := &Report{}
	r.add(ModeEngineSnapshot, sample(ModeEngineSnapshot, 900, nil), 1000)
	r.add(ModeUpsert, sample(ModeUpsert, 1000, &mismatches{table: SnapshotTable, diffs: []string{"a1: ...", "a2: ...", "a3: ..."}}), 1000)
	r.finish()
	if len(r.Failed) != 0 {
		t.Errorf("the peer's differences failed the run: %v", r.Failed)
	}
	up := r.row(ModeUpsert)
	if up.Mismatches == nil || *up.Mismatches != 3 || up.Check != "3 differ" {
		t.Errorf("upsert row: %d mismatches, check %q; want 3, \"3 differ\"", deref(up.Mismatches), up.Check)
	}
	if v := r.row(ModeEngineSnapshot).VsUpsert; v == nil || *v != 0.9 {
		t.Errorf("engine snapshot vs upsert = %v, want 0.9", v)
	}

	// A ratio the table prints as 1.00× is not called slower.
	tie := &Report{}
	tie.add(ModeEngineSnapshot, sample(ModeEngineSnapshot, 998.7, nil), 1000)
	tie.add(ModeUpsert, sample(ModeUpsert, 1000, nil), 1000)
	tie.finish()
	var tieOut bytes.Buffer
	if err := tie.Table(&tieOut); err != nil {
		t.Fatal(err)
	}
	if line := lineOf(tieOut.String(), "engine vs the upsert peer"); !strings.Contains(line, "engine snapshot 1.00× its events/s;") {
		t.Errorf("a tie: %q", line)
	}
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"×upsert", "3 differ", "upsert (batch/poll) differs from it for 3 accounts", "engine snapshot 0.90× its events/s (slower)",
		"reference fold: engine snapshot equal the reference fold"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := r.JSON(&out); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Rows []struct {
			Mode       string `json:"mode"`
			Mismatches *int   `json:"reference_mismatches"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for _, row := range back.Rows {
		if row.Mode == ModeUpsert && deref(row.Mismatches) != 3 {
			t.Errorf("JSON reference_mismatches of the peer = %v, want 3", row.Mismatches)
		}
	}

	// A peer whose check broke for another reason, or an engine whose
	// table differs, fails the run.
	r = &Report{}
	r.add(ModeUpsert, sample(ModeUpsert, 1000, errors.New("read last_event: connection refused")), 1000)
	r.add(ModeEngineSnapshot, sample(ModeEngineSnapshot, 900, &mismatches{table: SnapshotTable, diffs: []string{"a1: ..."}}), 1000)
	if len(r.Failed) != 2 {
		t.Errorf("failed: %v, want the peer's broken check and the engine's difference", r.Failed)
	}
	if !strings.HasPrefix(r.row(ModeEngineSnapshot).Check, "FAILED") {
		t.Errorf("engine snapshot differing: check %q, want FAILED", r.row(ModeEngineSnapshot).Check)
	}
}

func deref(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}

// The mismatch count is one per account: a row holding an older event, a
// missing row and a row of no account each count once.
func TestSnapshotDiffsCountAccounts(t *testing.T) {
	db := testenv.NewDB(t)
	projs, err := Projections(ModeEngineSnapshot, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(t.Context(), db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := func(id string, v int64) demo.Record {
		return demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: v, Type: "Deposited", Amount: v, OccurredAt: at}}
	}
	records := []demo.Record{ev("ok", 1), ev("ok", 2), ev("stale", 1), ev("stale", 2), ev("missing", 1)}
	for _, row := range []struct {
		id string
		v  int64
	}{{"ok", 2}, {"stale", 1}, {"stranger", 1}} {
		if _, err := db.Pool.Exec(t.Context(), upsertSQL, []string{row.id}, []string{"Deposited"}, []int64{row.v}, []time.Time{at}, []int64{row.v}); err != nil {
			t.Fatal(err)
		}
	}
	// The guard keeps the newer row: writing version 1 over 2 changes nothing.
	if _, err := db.Pool.Exec(t.Context(), upsertSQL, []string{"ok"}, []string{"Withdrawn"}, []int64{9}, []time.Time{at}, []int64{1}); err != nil {
		t.Fatal(err)
	}
	diffs, err := snapshotDiffs(t.Context(), db.Pool, records)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 3 {
		t.Fatalf("%d differences, want 3 (stale, missing, stranger):\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
	for i, prefix := range []string{"missing: no row", "stale: got Deposited/1", "stranger: got"} {
		if !strings.HasPrefix(diffs[i], prefix) {
			t.Errorf("difference %d: %q, want it to start with %q", i, diffs[i], prefix)
		}
	}
}

func lineOf(s, substr string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			return line
		}
	}
	return ""
}
