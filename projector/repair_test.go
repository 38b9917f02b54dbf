package projector_test

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
)

// TestGapRepair disturbs about 30% of the stream and loses one version of
// every tenth account. A repair source
// (HTTP) knows the lost events of half of them and answers 503 for the
// other half: the first half must end up complete, the second half keeps
// its contiguous prefix and its parked events move to the DLQ with class
// gap. Nothing stays parked.
func TestGapRepair(t *testing.T) {
	ctx := context.Background()
	opts := demo.DefaultOptions()
	// About 30% of the stream is disturbed: duplicates, swapped versions,
	// and one lost version in every tenth account.
	opts.Aggregates, opts.GapEvery, opts.Seed = 400, 10, 5
	opts.Duplicate, opts.Reorder = 0.15, 0.15
	records, dropped := demo.GenerateWithDropped(opts)
	lost := map[string]demo.Event{}
	for _, ev := range dropped {
		lost[ev.AccountID] = ev
	}
	if len(lost) < 10 {
		t.Fatalf("only %d gaps generated", len(lost))
	}
	repairable := func(key string) bool {
		h := fnv.New32a()
		h.Write([]byte(key))
		return h.Sum32()%2 == 0
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		if key == "" {
			key = r.URL.Path[len("/accounts/"):]
		}
		ev, ok := lost[key]
		missing, _ := strconv.ParseInt(r.URL.Query().Get("from"), 10, 64)
		switch {
		case !repairable(key):
			http.Error(w, "source down", http.StatusServiceUnavailable)
		case !ok || ev.Version != missing:
			http.NotFound(w, r)
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"events": []map[string]any{{
				"version": ev.Version, "type": ev.Type, "fields": map[string]any{"amount": ev.Amount},
			}}})
		}
	}))
	defer srv.Close()

	b := faultSetup(t, opts, 3).bundle
	b.produce(t, records)
	projs, err := projection.Parse([]byte(`
projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: fold
    type_field: type
    on_gap: repair
    gap_timeout: 100ms
    repair:
      http: {url: "`+srv.URL+`/accounts/{key}?from={version}", timeout: 2s}
    columns:
      account_id: {type: text, primary_key: true}
      owner:      {type: text}
      balance:    {type: bigint, default: 0}
      opened_at:  {type: timestamptz}
    events:
      AccountOpened: {set: {owner: owner, opened_at: occurred_at}}
      Deposited:     {add: {balance: amount}}
      Withdrawn:     {add: {balance: -amount}}
      AccountClosed: {delete: true}
`), ".")
	if err != nil {
		t.Fatal(err)
	}
	b.projs = projs
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.MaxAttempts = 3
	run(t, b.engine(t, "repair", projector.Config{Partition: cfg, Registerer: reg}))

	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, b.db.Pool, "repair", demo.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every gap to be repaired or dead-lettered", time.Minute, func() bool {
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})

	// Expected: the repaired accounts as if nothing was lost; the others
	// at their contiguous prefix.
	full := append([]demo.Record(nil), records...)
	for key, ev := range lost {
		if repairable(key) {
			full = append(full, demo.Record{Key: key, Event: ev})
		}
	}
	exp := demo.Fold(full)
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	var gapDead int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_dead_letters WHERE error_class = 'gap'`).Scan(&gapDead); err != nil {
		t.Fatal(err)
	}
	if gapDead != exp.Parked {
		t.Errorf("dead letters of class gap: %d, want the %d events parked behind unrepairable gaps", gapDead, exp.Parked)
	}
	repaired, deadGaps := 0.0, 0.0
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "projector_gaps_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resolution" && l.GetValue() == "repaired" {
					repaired += m.GetCounter().GetValue()
				}
				if l.GetName() == "resolution" && l.GetValue() == "dead_lettered" {
					deadGaps += m.GetCounter().GetValue()
				}
			}
		}
	}
	if repaired == 0 || deadGaps == 0 {
		t.Errorf("projector_gaps_total: repaired %v, dead_lettered %v; want both > 0", repaired, deadGaps)
	}
}
