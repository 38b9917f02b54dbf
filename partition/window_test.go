package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// memSink is a Sink over an in-memory table. Peek leaves out the
// aggregates of Keys.New, as a sink does for those it has not cached, and
// gives those in stale as they were, as a stale cache would; CommitBatch
// gives the plan what the table holds and applies its changes.
type memSink struct {
	mu       sync.Mutex // a transaction commits while the next window peeks
	rows     map[string]projection.Row
	versions map[string]int64
	stale    map[string]sinks.State
	parked   map[string][]sinks.StoredEvent
	next     int64
	commits  []memCommit
	// gate, when set, holds each commit until it is closed; peeked lists
	// the keys Peek was asked for.
	gate   chan struct{}
	peeked []string
	// fail, when set, is the error of the next commit (once).
	fail error
}

type memCommit struct {
	planned bool
	end     int64
	err     error
	changes sinks.Changes
}

func newMemSink() *memSink {
	return &memSink{rows: map[string]projection.Row{}, versions: map[string]int64{}, stale: map[string]sinks.State{},
		parked: map[string][]sinks.StoredEvent{}}
}

// parkedOf returns the parked events of keys.
func (s *memSink) parkedOf(keys []string) []sinks.StoredEvent {
	var evs []sinks.StoredEvent
	for _, k := range keys {
		evs = append(evs, s.parked[k]...)
	}
	return evs
}

func (s *memSink) state(keys []string, skip func(string) bool) sinks.State {
	st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	for _, k := range keys {
		if skip(k) {
			continue
		}
		if r := s.rows[k]; r != nil {
			st.Rows[k] = maps.Clone(r)
		}
		if v, ok := s.versions[k]; ok {
			st.Versions[k] = v
		}
	}
	return st
}

func (s *memSink) Peek(_ context.Context, _ sinks.Claim, keys sinks.Keys) (sinks.State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peeked = append(s.peeked, keys.All...)
	isNew := map[string]bool{}
	for _, k := range keys.New {
		isNew[k] = true
	}
	st := s.state(keys.All, func(k string) bool { return isNew[k] })
	st.Parked = s.parkedOf(keys.Parked)
	for _, k := range keys.All {
		if old, ok := s.stale[k]; ok {
			st.Rows[k], st.Versions[k] = maps.Clone(old.Rows[k]), old.Versions[k]
		}
	}
	return st, nil
}

func (s *memSink) CommitBatch(_ context.Context, claim sinks.Claim, end int64, keys sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail; err != nil {
		s.fail = nil
		s.commits = append(s.commits, memCommit{planned: keys.Planned, end: end, err: err})
		return err
	}
	if claim.NextOffset != s.next {
		return fmt.Errorf("commit from offset %d, stored %d", claim.NextOffset, s.next)
	}
	st := s.state(keys.All, func(string) bool { return false })
	st.Parked = s.parkedOf(keys.Parked)
	ch, err := plan(st)
	s.commits = append(s.commits, memCommit{planned: keys.Planned, end: end, err: err, changes: ch})
	if err != nil {
		return err
	}
	for _, u := range ch.Upserts {
		if u.Version <= s.versions[u.Key] {
			return fmt.Errorf("%s: write of v%d over v%d", u.Key, u.Version, s.versions[u.Key])
		}
		s.rows[u.Key], s.versions[u.Key] = u.Row, u.Version
	}
	for _, d := range ch.Deletes {
		delete(s.rows, d.Key)
		s.versions[d.Key] = d.Version
	}
	for _, e := range ch.Park {
		s.parked[e.Key] = append(s.parked[e.Key], e)
	}
	for _, u := range ch.Unpark {
		s.parked[u.Key] = slices.DeleteFunc(s.parked[u.Key], func(e sinks.StoredEvent) bool { return e.Version == u.Version })
		if len(s.parked[u.Key]) == 0 {
			delete(s.parked, u.Key)
		}
	}
	s.next = end
	return nil
}

func (s *memSink) Parked(context.Context, sinks.TP) (map[string]sinks.ParkedInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := map[string]sinks.ParkedInfo{}
	for k, evs := range s.parked {
		info[k] = sinks.ParkedInfo{Count: len(evs)}
	}
	return info, nil
}
func (s *memSink) Load(context.Context, sinks.TP, []string) (sinks.State, error) {
	return sinks.State{}, nil
}

// rewindFetcher is the fetcher of a worker fed from recs: a rewind pushes
// them again from the offset asked.
type rewindFetcher struct {
	w    *Worker
	recs []*kgo.Record
}

func (f *rewindFetcher) PauseFetchPartitions(map[string][]int32) map[string][]int32 { return nil }
func (f *rewindFetcher) ResumeFetchPartitions(map[string][]int32)                   {}
func (f *rewindFetcher) Rewind(_ sinks.TP, offset int64, done func()) {
	done()
	f.w.Push(f.recs[offset:], -1)
}

// windowWorker returns a worker of the demo's accounts projection over
// sink, with batches of batch records, and the records of events.
func windowWorker(t *testing.T, sink sinks.Sink, batch int, events []demo.Event) (*Worker, []*kgo.Record) {
	t.Helper()
	return windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 8}, events)
}

// windowWorkerConfig is windowWorker with cfg.
func windowWorkerConfig(t *testing.T, sink sinks.Sink, cfg Config, events []demo.Event) (*Worker, []*kgo.Record) {
	t.Helper()
	p, enc, dec := demoCodec(t)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := make([]*kgo.Record, len(events))
	for i, ev := range events {
		ev.OccurredAt = at
		value, err := enc.Encode(demo.Record{Key: ev.AccountID, Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: demo.Topic, Key: []byte(ev.AccountID), Value: value, Offset: int64(i), Timestamp: at}
	}
	f := &rewindFetcher{recs: recs}
	w := NewWorker(cfg, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: demo.Topic}},
		Projection: p, Sink: sink, Decoder: dec, Fetcher: f, Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), nil)})
	f.w = w
	return w, recs
}

// accountEvents returns versions from..to of accounts acc-00.. in turns:
// every account's version v before any account's v+1.
func accountEvents(accounts int, from, to int64) []demo.Event {
	var evs []demo.Event
	for v := from; v <= to; v++ {
		for a := 0; a < accounts; a++ {
			id := fmt.Sprintf("acc-%02d", a)
			ev := demo.Event{AccountID: id, Version: v, Type: "Deposited", Amount: v}
			if v == 1 {
				ev.Type, ev.Owner = "AccountOpened", "owner "+id
			}
			evs = append(evs, ev)
		}
	}
	return evs
}

// applyWindow runs the worker on recs, handed to it at once, as to a
// worker that is behind, until it has committed them all.
func applyWindow(t *testing.T, w *Worker, recs []*kgo.Record) {
	t.Helper()
	w.Push(recs, -1)
	done := make(chan error, 1)
	go func() { done <- w.Run(t.Context()) }()
	waitStored(t, w, int(recs[len(recs)-1].Offset+1))
	w.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A worker behind by several batches commits them in one transaction,
// each account's row written once, at its last version, equal to folding
// its events in order.
func TestWindowCommitsBatchesTogether(t *testing.T) {
	sink := newMemSink()
	const accounts, versions, batch = 20, 15, 50
	w, recs := windowWorker(t, sink, batch, accountEvents(accounts, 1, versions))
	applyWindow(t, w, recs)

	if len(sink.commits) != 1 || !sink.commits[0].planned {
		t.Fatalf("%d commits for %d batches of one window, want one planned before its transaction", len(sink.commits), len(recs)/batch)
	}
	if n := len(sink.commits[0].changes.Upserts); n != accounts {
		t.Errorf("%d row writes for %d accounts", n, accounts)
	}
	checkBalances(t, sink, accounts, versions, nil)
}

// When the table holds what the window's batches did not read (here an
// account whose first events are re-sent, assumed new), the window is
// applied again batch by batch, each planned on what the table holds: the
// re-sent events are stale, the rest apply once.
func TestWindowReplaysWhenTheTableDiffers(t *testing.T) {
	sink := newMemSink()
	const accounts, batch = 10, 20
	// acc-03 has been applied up to v5 before.
	sink.rows["acc-03"] = projection.Row{"account_id": "acc-03", "owner": "owner acc-03", "balance": int64(1000), "opened_at": nil}
	sink.versions["acc-03"] = 5
	w, recs := windowWorker(t, sink, batch, accountEvents(accounts, 1, 8))
	applyWindow(t, w, recs)

	if len(sink.commits) < 2 || !sink.commits[0].planned || !errors.Is(sink.commits[0].err, errWindowStale) {
		t.Fatalf("commits %+v: want a planned one refused, then batches on their own", sink.commits)
	}
	for i, c := range sink.commits[1:] {
		if c.planned || c.err != nil {
			t.Errorf("commit %d after the replay began: planned %v, error %v", i+1, c.planned, c.err)
		}
	}
	checkBalances(t, sink, accounts, 8, map[string]prior{"acc-03": {5, 1000}})
}

// An aggregate whose row in the table is newer than the state the window
// read (a stale cache) makes the commit refuse the plan, and the replay
// applies only what is newer.
func TestWindowReplaysOnStaleState(t *testing.T) {
	sink := newMemSink()
	const accounts, batch = 4, 8
	w, recs := windowWorker(t, sink, batch, accountEvents(accounts, 1, 12))
	// The first 3 versions are committed; then acc-01 moves on to v6
	// behind the worker's back, while what it reads still says v3.
	first := recs[:3*accounts]
	for len(first) > 0 {
		n := min(batch, len(first))
		if err := w.process(t.Context(), first[:n]); err != nil {
			t.Fatal(err)
		}
		first = first[n:]
	}
	sink.stale["acc-01"] = sink.state([]string{"acc-01"}, func(string) bool { return false })
	sink.rows["acc-01"]["balance"] = int64(500)
	sink.versions["acc-01"] = 6
	sink.commits = nil
	applyWindow(t, w, recs[3*accounts:])
	if len(sink.commits) < 2 || !errors.Is(sink.commits[0].err, errWindowStale) {
		t.Fatalf("commits %+v: want the window refused and replayed", sink.commits)
	}
	checkBalances(t, sink, accounts, 12, map[string]prior{"acc-01": {6, 500}})
}

// A worker with a share of a member's bound holds up to twice its share
// of aggregates in a transaction, however few of them its batches share:
// a partition with the member to itself collapses more of a stream with
// many aggregates.
func TestWindowHoldsTwiceTheShareOfAggregates(t *testing.T) {
	sink := newMemSink()
	const batch, share = 20, 40
	// 6 batches of 20 accounts each, each account in one batch only.
	events := accountEvents(6*batch, 1, 1)
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 8,
		Share: func() int { return share }}, events)
	applyWindow(t, w, recs)
	if len(sink.commits) != 2 {
		t.Fatalf("%d transactions, want 2: four batches of distinct accounts, then two", len(sink.commits))
	}
	if c := sink.commits[0]; !c.planned || c.end != 4*batch || len(c.changes.Upserts) != 2*share {
		t.Errorf("first transaction: planned %v, up to offset %d, %d rows; want four batches' %d accounts", c.planned, c.end, len(c.changes.Upserts), 2*share)
	}
	checkAccounts(t, sink, events)
}

// A window ends once it holds as many aggregates as two batches, however
// much its batches share: the rows it holds stay bounded.
func TestWindowEndsAtTwoBatchesOfAggregates(t *testing.T) {
	sink := newMemSink()
	const batch = 20
	// Each batch: 10 accounts of the batch before at their next version,
	// 10 new ones.
	var events []demo.Event
	for b := 0; b < 6; b++ {
		for a := 0; a < 20; a++ {
			acc := 10*b + a - 10 // batch 0: accounts -10..9
			if acc < 0 {
				acc += 1000
			}
			events = append(events, demo.Event{AccountID: fmt.Sprintf("acc-%04d", acc)})
		}
	}
	numberVersions(events)
	w, recs := windowWorker(t, sink, batch, events)
	applyWindow(t, w, recs)
	if len(sink.commits) < 2 {
		t.Fatalf("%d transactions, want the first to end at 40 accounts", len(sink.commits))
	}
	if c := sink.commits[0]; c.end != 3*batch || len(c.changes.Upserts) != 2*batch {
		t.Errorf("first transaction up to offset %d with %d rows; want three batches' %d accounts", c.end, len(c.changes.Upserts), 2*batch)
	}
	checkAccounts(t, sink, events)
}

// A window counts records, not batches: batches taken as records trickle
// in fill it as full ones do.
func TestWindowCountsRecords(t *testing.T) {
	sink := newMemSink()
	const batch = 50
	events := accountEvents(10, 1, 15) // 150 records
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Second, CommitMaxBatches: 2}, events)
	run := runWorker(t, w)
	w.Push(recs[:batch], int64(len(recs)))
	for at := batch; at < 2*batch; at += 10 {
		waitTaken(t, w)
		w.Push(recs[at:at+10], int64(len(recs)))
	}
	waitStored(t, w, 2*batch)
	w.Push(recs[2*batch:], int64(len(recs)))
	waitStored(t, w, len(recs))
	run()
	if c := sink.commits[0]; c.end != 2*batch {
		t.Errorf("first transaction up to offset %d; want the %d records of two full batches in six", c.end, 2*batch)
	}
	checkAccounts(t, sink, events)
}

// A window waits longer than a batch would for its next batch while a
// full batch is left in the partition (fetching it takes longer than
// BatchMaxWait on a busy processor), and not at all once less is left.
func TestWindowWaitsForTheNextBatch(t *testing.T) {
	const batch, wait = 20, 40 * time.Millisecond
	for _, tc := range []struct {
		name    string
		left    int64 // records in the partition past the first batch, as its high watermark says
		commits int
	}{
		{"a full batch left", batch, 1},
		{"less than a batch left", batch - 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newMemSink()
			events := accountEvents(10, 1, 3)[:batch+10]
			w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: wait, CommitMaxBatches: 50}, events)
			run := runWorker(t, w)
			w.Push(recs[:batch], batch+tc.left)
			waitTaken(t, w)
			time.Sleep(10 * wait) // the next fetch is late
			w.Push(recs[batch:], batch+tc.left)
			waitStored(t, w, len(recs))
			run()
			if len(sink.commits) != tc.commits {
				t.Errorf("%d transactions, want %d", len(sink.commits), tc.commits)
			}
			checkAccounts(t, sink, events)
		})
	}
}

// A worker that has caught up commits its window at once: records that
// trickle in after it would keep the window's rows unwritten for as long
// as they came.
func TestWindowEndsOnceCaughtUp(t *testing.T) {
	sink := newMemSink()
	const batch = 20
	events := accountEvents(5, 1, 5) // 25 records
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Second, CommitMaxBatches: 50}, events)
	run := runWorker(t, w)
	w.Push(recs[:batch], int64(len(recs)))
	waitTaken(t, w)
	w.Push(recs[batch:], int64(len(recs)))
	waitStored(t, w, len(recs))
	run()
	if c := sink.commits[0]; c.end != batch {
		t.Errorf("first transaction up to offset %d; want the full batch's %d alone, less than a batch being left after it", c.end, batch)
	}
	checkAccounts(t, sink, events)
}

// A window whose transaction writes nothing the next window reads but
// rows (a dead letter it does not read) commits while the worker plans the
// next window on the state it leaves: the next one neither waits for that
// commit nor reads the aggregates the two share.
func TestWindowPlansWhileTheOneBeforeCommits(t *testing.T) {
	for _, poison := range []bool{false, true} {
		sink := newMemSink()
		const batch = 20
		events := accountEvents(10, 1, 8) // two windows of 40 records, the same 10 accounts
		w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2}, events)
		if poison { // one more record in the first window, not in the wire format
			bad := &kgo.Record{Topic: demo.Topic, Key: []byte("acc-00"), Value: []byte("not avro")}
			recs = slices.Insert(recs, 5, bad)
			for i, r := range recs {
				r.Offset = int64(i)
			}
			recs = recs[:len(recs)-1] // the windows stay 40 records each; the last event goes
			events = events[:len(events)-1]
		}
		runHeld(t, sink, w, recs)
		if len(sink.commits) != 2 || sink.commits[0].end != 2*batch || sink.commits[1].end != int64(len(recs)) {
			t.Fatalf("poison %v: commits %+v: want two windows, in order", poison, sink.commits)
		}
		if dead := len(sink.commits[0].changes.DeadLetters); dead != map[bool]int{false: 0, true: 1}[poison] {
			t.Errorf("poison %v: %d dead letters in the first window", poison, dead)
		}
		if len(sink.peeked) != 10 {
			t.Errorf("poison %v: peeked %d keys, want the first window's 10 only: the second starts from what the first writes", poison, len(sink.peeked))
		}
		checkAccounts(t, sink, events)
	}
}

// A window that parks events also commits while the next one is planned:
// the next takes the events it parks as parked ones, applies them once
// their gap fills, and unparks them after the first has stored them.
func TestWindowParkingPlansWhileTheOneBeforeCommits(t *testing.T) {
	sink := newMemSink()
	const batch = 20
	events := accountEvents(10, 1, 8) // two windows of 40 records, the same 10 accounts
	// acc-00's v2 comes in the second window, its v5 in the first: the
	// first window parks v3, v4 and v5.
	events[10], events[40] = events[40], events[10]
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2}, events)
	runHeld(t, sink, w, recs)
	if len(sink.commits) != 2 {
		t.Fatalf("commits %+v: want two windows", sink.commits)
	}
	want := []sinks.ParkedRef{{Key: "acc-00", Version: 3}, {Key: "acc-00", Version: 4}, {Key: "acc-00", Version: 5}}
	if got := parkedRefs(sink.commits[0].changes.Park); !slices.Equal(got, want) {
		t.Errorf("the first window parked %v, want %v", got, want)
	}
	unparked := slices.Clone(sink.commits[1].changes.Unpark)
	slices.SortFunc(unparked, func(a, b sinks.ParkedRef) int { return int(a.Version - b.Version) })
	if !slices.Equal(unparked, want) {
		t.Errorf("the second window unparked %v, want %v", unparked, want)
	}
	if len(sink.parked) != 0 {
		t.Errorf("still parked: %v", parkedRefs(slices.Concat(slices.Collect(maps.Values(sink.parked))...)))
	}
	checkAccounts(t, sink, events)
}

// A window that resolves a dead letter (its record, replayed, applied)
// also commits while the next one is planned.
func TestWindowResolvingPlansWhileTheOneBeforeCommits(t *testing.T) {
	sink := newMemSink()
	const batch = 20
	events := accountEvents(10, 1, 8)
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2}, events)
	recs[5].Headers = []kgo.RecordHeader{{Key: sinks.ReplayHeader, Value: []byte("42")}} // the replay of dead letter 42
	runHeld(t, sink, w, recs)
	if len(sink.commits) != 2 || !slices.Equal(sink.commits[0].changes.Resolved, []int64{42}) {
		t.Fatalf("commits %+v: want two windows, the first resolving dead letter 42", sink.commits)
	}
	checkAccounts(t, sink, events)
}

// Parked events the sink still holds that the pending window has
// unparked are not read again by the next window: it neither applies nor
// unparks them a second time.
func TestWindowLeavesOutWhatThePendingOneUnparks(t *testing.T) {
	sink := newMemSink()
	sink.gate = make(chan struct{}) // one commit per token
	const batch = 20
	events := accountEvents(10, 1, 12) // three windows of 40 records
	// The first window parks acc-00's v3, v4 and v5; the second fills the
	// gap and unparks them; the third has acc-00's v9 to v12.
	events[10], events[40] = events[40], events[10]
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2}, events)
	w.Push(recs, int64(len(recs)))
	run := runWorker(t, w)
	sink.gate <- struct{}{} // the first window commits
	waitTaken(t, w)         // the third window is planned while the second one's commit waits
	sink.gate <- struct{}{}
	sink.gate <- struct{}{}
	waitStored(t, w, len(recs))
	run()
	if len(sink.commits) != 3 {
		t.Fatalf("commits %+v: want three windows", sink.commits)
	}
	if n := len(sink.commits[1].changes.Unpark); n != 3 {
		t.Errorf("the second window unparked %d events, want acc-00's v3 to v5", n)
	}
	if u := sink.commits[2].changes.Unpark; len(u) != 0 {
		t.Errorf("the third window unparked %v again", u)
	}
	if len(sink.parked) != 0 {
		t.Errorf("still parked: %v", parkedRefs(slices.Concat(slices.Collect(maps.Values(sink.parked))...)))
	}
	checkAccounts(t, sink, events)
}

// A parked event a window's batch has unparked (here dead-lettered: it no
// longer decodes) is not read again by its later batches while Postgres
// still holds it: it is dead-lettered once.
func TestWindowDeadLettersARestoredEventOnce(t *testing.T) {
	sink := newMemSink()
	priors := map[string]prior{}
	for a := range 10 {
		id := fmt.Sprintf("acc-%02d", a)
		sink.rows[id] = projection.Row{"account_id": id, "owner": "owner " + id, "balance": int64(2), "opened_at": nil}
		sink.versions[id] = 2
		priors[id] = prior{2, 2}
	}
	// An earlier transaction parked acc-00's v4, whose value no longer decodes.
	sink.parked["acc-00"] = []sinks.StoredEvent{{Key: "acc-00", Version: 4, Offset: 999, RecordKey: []byte("acc-00"), Value: []byte("not avro")}}
	const batch = 20
	events := accountEvents(10, 3, 6) // one window of two batches, acc-00 in both
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2}, events)
	applyWindow(t, w, recs)
	var dead []int64
	for _, c := range sink.commits {
		for _, d := range c.changes.DeadLetters {
			dead = append(dead, d.Offset)
		}
	}
	if !slices.Equal(dead, []int64{999}) {
		t.Errorf("dead letters at offsets %v, want the parked event's once", dead)
	}
	if len(sink.parked) != 0 {
		t.Errorf("still parked: %v", parkedRefs(slices.Concat(slices.Collect(maps.Values(sink.parked))...)))
	}
	checkBalances(t, sink, 10, 6, priors)
}

// parkedRefs names evs, in the order of their versions.
func parkedRefs(evs []sinks.StoredEvent) []sinks.ParkedRef {
	var out []sinks.ParkedRef
	for _, e := range evs {
		out = append(out, sinks.ParkedRef{Key: e.Key, Version: e.Version})
	}
	slices.SortFunc(out, func(a, b sinks.ParkedRef) int { return int(a.Version - b.Version) })
	return out
}

// When the window committing in the background turns out stale, the one
// planned on it is void: the records from the stale window's first are
// applied again, each once.
func TestWindowPlannedOnAStaleOneIsVoid(t *testing.T) {
	for _, gap := range []bool{false, true} {
		sink := newMemSink()
		// acc-03 has been applied up to v2 before: the first window assumed it new.
		sink.rows["acc-03"] = projection.Row{"account_id": "acc-03", "owner": "owner acc-03", "balance": int64(1000), "opened_at": nil}
		sink.versions["acc-03"] = 2
		const batch = 20
		events := accountEvents(10, 1, 8)
		if gap { // the first window also parks acc-00's v3 to v5, which the second takes
			events[10], events[40] = events[40], events[10]
		}
		w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2}, events)
		runHeld(t, sink, w, recs)
		if !errors.Is(sink.commits[0].err, errWindowStale) {
			t.Fatalf("gap %v: commits %+v: want the first window refused", gap, sink.commits)
		}
		for _, c := range sink.commits[1:] {
			if c.err != nil {
				t.Errorf("gap %v: commit up to %d after the replay: %v", gap, c.end, c.err)
			}
		}
		if len(sink.parked) != 0 {
			t.Errorf("gap %v: still parked: %v", gap, parkedRefs(slices.Concat(slices.Collect(maps.Values(sink.parked))...)))
		}
		checkBalances(t, sink, 10, 8, map[string]prior{"acc-03": {2, 1000}})
	}
}

// A window committing in the background that fails for a transient
// reason is retried, and the window planned on it meanwhile stands: it
// commits after it, without being applied again.
func TestWindowPlannedOnARetriedOneStands(t *testing.T) {
	sink := newMemSink()
	sink.fail = errors.New("connection reset")
	const batch = 20
	events := accountEvents(10, 1, 8)
	w, recs := windowWorkerConfig(t, sink, Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: 2,
		RetryBase: time.Millisecond, RetryCap: time.Millisecond}, events)
	runHeld(t, sink, w, recs)
	var ends []int64
	for _, c := range sink.commits {
		ends = append(ends, c.end)
	}
	if len(sink.commits) != 3 || sink.commits[0].err == nil || !slices.Equal(ends, []int64{2 * batch, 2 * batch, 4 * batch}) {
		t.Errorf("commits up to %v (first error %v): want the first window failed, retried, then the second", ends, sink.commits[0].err)
	}
	if len(sink.peeked) != 10 {
		t.Errorf("peeked %d keys, want the first window's 10 only", len(sink.peeked))
	}
	checkAccounts(t, sink, events)
}

// numberVersions gives each event its account's next version, the first
// one opening the account.
func numberVersions(events []demo.Event) {
	next := map[string]int64{}
	for i := range events {
		ev := &events[i]
		next[ev.AccountID]++
		ev.Version, ev.Type, ev.Amount = next[ev.AccountID], "Deposited", next[ev.AccountID]
		if ev.Version == 1 {
			ev.Type, ev.Owner = "AccountOpened", "owner "+ev.AccountID
		}
	}
}

// prior is an account's version and balance in the table before the
// worker ran.
type prior struct{ version, balance int64 }

// checkBalances checks that accounts acc-00.. of accountEvents are at
// version v, opened by their first event with every later one deposited
// (version k deposits k) on top of what priors gives (none: from v1).
func checkBalances(t *testing.T, sink *memSink, accounts int, v int64, priors map[string]prior) {
	t.Helper()
	for a := 0; a < accounts; a++ {
		id := fmt.Sprintf("acc-%02d", a)
		from := prior{1, 0}
		if p, ok := priors[id]; ok {
			from = p
		}
		want := from.balance
		for k := from.version + 1; k <= v; k++ {
			want += k
		}
		if sink.versions[id] != v || sink.rows[id]["balance"] != want || sink.rows[id]["owner"] != "owner "+id {
			t.Errorf("%s: v%d %v, want v%d with balance %d, owner %q", id, sink.versions[id], sink.rows[id], v, want, "owner "+id)
		}
	}
}

// checkAccounts compares the table with the reference fold of events.
func checkAccounts(t *testing.T, sink *memSink, events []demo.Event) {
	t.Helper()
	recs := make([]demo.Record, len(events))
	for i, ev := range events {
		recs[i] = demo.Record{Key: ev.AccountID, Event: ev}
	}
	for id, acc := range demo.Fold(recs).Accounts {
		got := sink.rows[id]
		if sink.versions[id] != acc.Version || got == nil || got["balance"] != acc.Balance || got["owner"] != acc.Owner {
			t.Errorf("%s: v%d %v, want v%d with balance %d, owner %q", id, sink.versions[id], got, acc.Version, acc.Balance, acc.Owner)
		}
	}
}

// runWorker starts w; the function returned stops it and fails t on its
// error.
func runWorker(t *testing.T, w *Worker) func() {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- w.Run(t.Context()) }()
	return func() {
		w.Stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// runHeld runs w on recs with each commit held until the worker has
// taken every record: the last window is planned while the one before it
// waits to commit.
func runHeld(t *testing.T, sink *memSink, w *Worker, recs []*kgo.Record) {
	t.Helper()
	sink.gate = make(chan struct{})
	w.Push(recs, int64(len(recs)))
	run := runWorker(t, w)
	waitTaken(t, w)
	close(sink.gate)
	waitStored(t, w, len(recs))
	run()
}

// waitTaken waits until w has taken every record pushed to it.
func waitTaken(t *testing.T, w *Worker) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, func() error {
		w.mu.Lock()
		n := len(w.queue)
		w.mu.Unlock()
		if n != 0 {
			return fmt.Errorf("%d records still queued", n)
		}
		return nil
	})
}

// waitStored waits until w has committed up to offset next.
func waitStored(t *testing.T, w *Worker, next int) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if got := w.Status().NextOffset; got < int64(next) {
			return fmt.Errorf("stored next offset %d, want %d", got, next)
		}
		return nil
	})
}

// A Go fold reads events' Fields: a worker whose decoder could decode
// into values gives it maps, while a compiled fold takes values.
func TestGoFoldGetsFieldsMaps(t *testing.T) {
	for _, goFold := range []bool{false, true} {
		p, enc, dec := demoCodec(t)
		if _, ok := dec.(ValuesDecoder); !ok {
			t.Fatal("the demo's decoder does not decode into values")
		}
		compiled, maps := p.Compiled(), 0
		if goFold {
			p.Fold = func(r projection.Row, ev projection.Event) (projection.Row, error) {
				if ev.Fields != nil {
					maps++
				}
				return compiled(r, ev)
			}
		}
		w := NewWorker(Config{}, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: demo.Topic}}, Projection: p, Sink: newMemSink(), Decoder: dec,
			Fetcher: &rewindFetcher{}, Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), nil)})
		if (w.lanes[0].values != nil) == goFold {
			t.Errorf("Go fold %v: decoding into values %v", goFold, w.lanes[0].values != nil)
		}
		events := accountEvents(3, 1, 2)
		var recs []*kgo.Record
		for i, ev := range events {
			value, err := enc.Encode(demo.Record{Key: ev.AccountID, Event: ev})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Key: []byte(ev.AccountID), Value: value, Offset: int64(i)})
		}
		if err := w.process(t.Context(), recs); err != nil {
			t.Fatal(err)
		}
		if goFold && maps != len(events) {
			t.Errorf("the Go fold got %d of %d events with Fields", maps, len(events))
		}
		checkAccounts(t, w.lanes[0].sink.(*memSink), events)
	}
}
