package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
)

// repairBundle is a stream with lost versions and an HTTP repair source
// that knows them.
type repairBundle struct {
	*faultBundle
	records []demo.Record
	lost    map[string]demo.Event
	srv     *httptest.Server
	// answer, when set, decides a request before the lost events are
	// looked up: a status to answer with, or 0 to go on.
	answer func(key string) int
}

func repairSetup(t *testing.T) *repairBundle {
	t.Helper()
	opts := demo.DefaultOptions()
	// About 30% of the stream is disturbed: duplicates, swapped versions,
	// and one lost version in every tenth account.
	opts.Aggregates, opts.GapEvery, opts.Seed = 400, 10, 5
	opts.Duplicate, opts.Reorder = 0.15, 0.15
	records, dropped := demo.GenerateWithDropped(opts)
	b := &repairBundle{records: records, lost: map[string]demo.Event{}}
	for _, ev := range dropped {
		b.lost[ev.AccountID] = ev
	}
	if len(b.lost) < 10 {
		t.Fatalf("only %d gaps generated", len(b.lost))
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Path[len("/accounts/"):]
		if b.answer != nil {
			if code := b.answer(key); code != 0 {
				http.Error(w, http.StatusText(code), code)
				return
			}
		}
		ev, ok := b.lost[key]
		missing, _ := strconv.ParseInt(r.URL.Query().Get("from"), 10, 64)
		if !ok || ev.Version != missing {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"events": []map[string]any{{
			"version": ev.Version, "type": ev.Type, "fields": map[string]any{"amount": ev.Amount},
		}}})
	}))
	t.Cleanup(b.srv.Close)
	b.faultBundle = faultSetup(t, opts, 3)
	var err error
	b.projs, err = projection.Parse([]byte(`
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
      http: {url: "`+b.srv.URL+`/accounts/{key}?from={version}", timeout: 2s}
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
	return b
}

// settle waits until the engine committed the whole log and nothing is
// parked any more.
func (b *repairBundle) settle(t *testing.T, identity string) {
	t.Helper()
	ctx := t.Context()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, b.db.Pool, identity, demo.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() error {
		if n := parked(t, b); n != 0 {
			return fmt.Errorf("%d events still parked", n)
		}
		return nil
	})
}

func parked(t *testing.T, b *repairBundle) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_parked`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func gapDeadLetters(t *testing.T, b *repairBundle) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_dead_letters WHERE error_class = 'gap'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGapRepair disturbs about 30% of the stream and loses one version of
// every tenth account. A repair source (HTTP) knows the lost events of
// half of them and answers 404 for the other half: the first half must
// end up complete, the second half keeps its contiguous prefix and its
// parked events move to the DLQ with class gap, at the first answer
// (a definite "not found" is not retried). Nothing stays parked.
func TestGapRepair(t *testing.T) {
	ctx := t.Context()
	b := repairSetup(t)
	repairable := func(key string) bool {
		h := fnv.New32a()
		h.Write([]byte(key))
		return h.Sum32()%2 == 0
	}
	var notFound sync.Map // key → requests answered 404
	b.answer = func(key string) int {
		if _, lost := b.lost[key]; lost && !repairable(key) {
			n, _ := notFound.LoadOrStore(key, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			return http.StatusNotFound
		}
		return 0
	}
	b.produce(t, b.records)
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.MaxAttempts = 3
	run(t, b.engine(t, "repair", projector.Config{Partition: cfg, Registerer: reg}))
	b.settle(t, "repair")

	// Expected: the repaired accounts as if nothing was lost; the others
	// at their contiguous prefix.
	full := append([]demo.Record(nil), b.records...)
	for key, ev := range b.lost {
		if repairable(key) {
			full = append(full, demo.Record{Key: key, Event: ev})
		}
	}
	exp := demo.Fold(full)
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	if n := gapDeadLetters(t, b); n != exp.Parked {
		t.Errorf("dead letters of class gap: %d, want the %d events parked behind unrepairable gaps", n, exp.Parked)
	}
	notFound.Range(func(key, n any) bool {
		if n := n.(*atomic.Int32).Load(); n != 1 {
			t.Errorf("the source was asked about %s %d times after answering 404: a definite not-found must dead-letter at once", key, n)
		}
		return true
	})
	if repaired, dead := counterWith(t, reg, "projector_gaps_total", "resolution", "repaired"),
		counterWith(t, reg, "projector_gaps_total", "resolution", "dead_lettered"); repaired == 0 || dead == 0 {
		t.Errorf("projector_gaps_total: repaired %v, dead_lettered %v; want both > 0", repaired, dead)
	}
}

// TestGapRepairSourceOutage takes the repair source down (503) from
// before the first gap times out until every gapped aggregate has been
// turned away more often than --max-attempts allows, then brings it back.
// An outage is not an answer: nothing may be dead-lettered, the events
// stay parked meanwhile (with a gauge saying why), the outage is logged a
// few times, not once per attempt, and once the source answers every gap
// is repaired: the table equals the fold of the whole log, lost versions
// included.
func TestGapRepairSourceOutage(t *testing.T) {
	ctx := t.Context()
	b := repairSetup(t)
	const maxAttempts = 3
	var (
		down    atomic.Bool
		refused sync.Map // key → requests answered 503
	)
	down.Store(true)
	b.answer = func(key string) int {
		if down.Load() {
			n, _ := refused.LoadOrStore(key, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			return http.StatusServiceUnavailable
		}
		return 0
	}
	b.produce(t, b.records)
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	cfg := fastRetry
	cfg.MaxAttempts = maxAttempts
	run(t, b.engine(t, "outage", projector.Config{Partition: cfg, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}))

	testenv.WaitFor(t, time.Minute, func() error {
		if gapDeadLetters(t, b) > 0 {
			return nil // dead-lettered during the outage: reported below
		}
		waiting := 0
		for key := range b.lost {
			if n, ok := refused.Load(key); ok && n.(*atomic.Int32).Load() > 2*maxAttempts {
				waiting++
			}
		}
		if waiting < len(b.lost) {
			return fmt.Errorf("%d of %d gapped aggregates asked the source more than %d times", waiting, len(b.lost), 2*maxAttempts)
		}
		return nil
	})
	if n := gapDeadLetters(t, b); n != 0 {
		t.Fatalf("%d events dead-lettered because the repair source was down: an outage must never dead-letter", n)
	}
	if n := parked(t, b); n == 0 {
		t.Fatal("nothing parked while the repair source is down")
	}
	if g := gauge(t, reg, "projector_gap_repair_unavailable"); g == 0 {
		t.Error("projector_gap_repair_unavailable is 0 while every gap waits for the source")
	}
	if c := counterWith(t, reg, "projector_gap_repair_failures_total", "reason", "unavailable"); c < float64(len(b.lost)) {
		t.Errorf(`projector_gap_repair_failures_total{reason="unavailable"} = %v, want at least one per gap (%d)`, c, len(b.lost))
	}

	down.Store(false)
	b.settle(t, "outage")
	full := append([]demo.Record(nil), b.records...)
	for key, ev := range b.lost {
		full = append(full, demo.Record{Key: key, Event: ev})
	}
	exp := demo.Fold(full)
	if err := demo.Verify(ctx, b.db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	if n := gapDeadLetters(t, b); n != 0 {
		t.Errorf("%d events dead-lettered after an outage of the repair source", n)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		if g := gauge(t, reg, "projector_gap_repair_unavailable"); g != 0 {
			return fmt.Errorf("projector_gap_repair_unavailable = %v after the source came back", g)
		}
		return nil
	})
	out := logs.String()
	// One line when the outage starts, per partition (3): not one per
	// aggregate and attempt.
	if n := strings.Count(out, "gap repair source unavailable"); n == 0 || n > 6 {
		t.Errorf("the outage was logged %d times, want once or twice per partition:\n%s", n, out)
	}
	if n := strings.Count(out, "gap repair failed"); n > 0 {
		t.Errorf("the outage was logged as %d repair failures:\n%s", n, out)
	}
}

// counterWith sums the samples of a family that have label name=value.
func counterWith(t *testing.T, g prometheus.Gatherer, family, name, value string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metrics(t, g, family) {
		for _, l := range m.GetLabel() {
			if l.GetName() == name && l.GetValue() == value {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
