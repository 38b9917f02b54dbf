// Package sinktest is the conformance suite of the sinks contract: every
// sink and offset store the engine can be handed runs it, so that they
// all keep the promises a partition worker relies on (fencing, one
// transaction per batch, versions that never go back, parked events kept
// per identity and partition).
//
// It must not know any sink: a sink's own tests call Run with a factory.
package sinktest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// Store is what the suite is handed: an engine's store of sinks and
// offsets.
type Store interface {
	Offsets(identity string) sinks.Offsets
	Sink(t sinks.Target) (sinks.Sink, error)
}

// Projections are the projections the suite writes: Projection and a
// second read model of its topic, in a table of its own. Make their
// tables before handing the suite a store.
func Projections() []*projection.Projection {
	ps, err := projection.Parse([]byte(`projections:
  - name: conformance_owners
    topic: conformance.events
    table: conformance_owners
    key: id
    mode: snapshot
    columns:
      id:    {type: text, primary_key: true}
      owner: {type: text}
`), ".")
	if err != nil {
		panic(fmt.Sprintf("the second conformance projection does not parse: %v", err))
	}
	return []*projection.Projection{Projection(), ps[0]}
}

// Projection is the projection the suite writes most: make its table
// (and those of Projections) before handing the suite a store.
func Projection() *projection.Projection {
	ps, err := projection.Parse([]byte(`projections:
  - name: conformance
    topic: conformance.events
    table: conformance
    key: id
    mode: snapshot
    columns:
      id:      {type: text, primary_key: true}
      owner:   {type: text}
      balance: {type: bigint}
`), ".")
	if err != nil {
		panic(fmt.Sprintf("the conformance projection does not parse: %v", err))
	}
	p := ps[0]
	// A fold that reads rows, so that every sink hands the plan whole
	// rows rather than empty ones that only say a row exists.
	fold := p.Compiled()
	p.Fold = func(r projection.Row, ev projection.Event) (projection.Row, error) { return fold(r, ev) }
	return p
}

// Run runs the suite. newStore returns an empty store in which the
// tables of Projections() exist; it is called once per test. A sink that
// is a sinks.LaneCommitter also runs the tests of projections sharing a
// topic.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"ClaimResumesFromTheStoredOffset", claimResumes},
		{"CommitWritesRowsAndMovesTheOffset", commitWrites},
		{"NewerOwnerFencesOlder", newerOwnerFences},
		{"WrongStartOffsetIsFenced", wrongStartFenced},
		{"UninitialisedPartitionIsFenced", uninitialisedFenced},
		{"PlanErrorWritesNothing", planErrorWritesNothing},
		{"NewerVersionReplacesTheRow", newerVersionReplaces},
		{"DeleteKeepsTheVersion", deleteKeepsVersion},
		{"TombstoneDeletesAtTheRowsVersion", tombstoneDeletes},
		{"ParkedEventsKeptPerPartitionAndIdentity", parkedEvents},
		{"AssumedNewThatExistsIsPlannedFromItsState", assumedNew},
		{"PeekSeesWhatABatchLoads", peek},
		{"NothingToAdoptWithoutAReset", nothingToAdopt},
		{"LanesCommitTogetherWithOneOffset", lanesCommit},
		{"LaneFailureWritesNoLane", laneFailure},
		{"LanesAreFencedTogether", lanesFenced},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newHarness(t, newStore(t)))
		})
	}
}

const identity = "conformance"

// harness is one test's store, sink and offset store, on partition 0.
type harness struct {
	t     *testing.T
	ctx   context.Context
	store Store
	p     *projection.Projection
	offs  sinks.Offsets
	sink  sinks.Sink
	tp    sinks.TP
}

func newHarness(t *testing.T, s Store) *harness {
	p := Projection()
	sink, err := s.Sink(sinks.Target{Identity: identity, Projection: p})
	if err != nil {
		t.Fatalf("sink of %s: %v", p.Name, err)
	}
	return &harness{t: t, ctx: t.Context(), store: s, p: p, offs: s.Offsets(identity), sink: sink, tp: sinks.TP{Topic: p.Topic}}
}

// claim claims tp and, when nothing is stored, stores first.
func (h *harness) claim(offs sinks.Offsets, tp sinks.TP, first int64) sinks.Claim {
	h.t.Helper()
	cs, err := offs.Claim(h.ctx, []sinks.TP{tp})
	if err != nil || len(cs) != 1 {
		h.t.Fatalf("claim %v: %v, %v", tp, cs, err)
	}
	c := cs[0]
	if c.NextOffset != nil {
		return sinks.Claim{TP: tp, Epoch: c.Epoch, NextOffset: *c.NextOffset, Since: c.At}
	}
	set, err := offs.InitAll(h.ctx, cs, []int64{first})
	if err != nil || !slices.Equal(set, []sinks.TP{tp}) {
		h.t.Fatalf("store the first offset of %v: %v, %v", tp, set, err)
	}
	return sinks.Claim{TP: tp, Epoch: c.Epoch, NextOffset: first, Since: c.At}
}

func (h *harness) commit(c sinks.Claim, end int64, keys []string, ch sinks.Changes) error {
	return h.sink.CommitBatch(h.ctx, c, end, sinks.Keys{All: keys, Parked: keys}, func(sinks.State) (sinks.Changes, error) { return ch, nil })
}

// mustCommit commits ch from c and moves c to end.
func (h *harness) mustCommit(c *sinks.Claim, end int64, ch sinks.Changes) {
	h.t.Helper()
	if err := h.commit(*c, end, keysOf(ch), ch); err != nil {
		h.t.Fatalf("commit %d→%d: %v", c.NextOffset, end, err)
	}
	c.NextOffset = end
}

func keysOf(ch sinks.Changes) []string {
	var keys []string
	for _, u := range ch.Upserts {
		keys = append(keys, u.Key)
	}
	for _, d := range ch.Deletes {
		keys = append(keys, d.Key)
	}
	for _, p := range ch.Park {
		keys = append(keys, p.Key)
	}
	for _, u := range ch.Unpark {
		keys = append(keys, u.Key)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

func (h *harness) load(keys ...string) sinks.State {
	h.t.Helper()
	st, err := h.sink.Load(h.ctx, h.tp, keys)
	if err != nil {
		h.t.Fatalf("load %v: %v", keys, err)
	}
	return st
}

// stored is where the next owner of tp resumes (claiming it again).
func (h *harness) stored(tp sinks.TP) *int64 {
	h.t.Helper()
	cs, err := h.offs.Claim(h.ctx, []sinks.TP{tp})
	if err != nil || len(cs) != 1 {
		h.t.Fatalf("claim %v: %v, %v", tp, cs, err)
	}
	return cs[0].NextOffset
}

func row(id, owner string, balance int64) projection.Row {
	return projection.Row{"id": id, "owner": owner, "balance": balance}
}

func upsert(id string, v int64, owner string, balance int64) sinks.RowWrite {
	return sinks.RowWrite{Key: id, Version: v, Row: row(id, owner, balance)}
}

// same reports whether a loaded row holds want, whatever Go types the
// sink reads its columns back as.
func same(got, want projection.Row) bool {
	norm := func(r projection.Row) map[string]string {
		out := map[string]string{}
		for k, v := range r {
			if v != nil {
				out[k] = fmt.Sprint(v)
			}
		}
		return out
	}
	return got != nil && reflect.DeepEqual(norm(got), norm(want))
}

func claimResumes(t *testing.T, h *harness) {
	cs, err := h.offs.Claim(h.ctx, []sinks.TP{h.tp})
	if err != nil {
		t.Fatal(err)
	}
	if cs[0].NextOffset != nil || cs[0].Epoch < 1 {
		t.Fatalf("first claim = %+v, want no stored offset and an epoch ≥ 1", cs[0])
	}
	if set, err := h.offs.InitAll(h.ctx, cs, []int64{7}); err != nil || len(set) != 1 {
		t.Fatalf("InitAll = %v, %v; want the partition set", set, err)
	}
	again, err := h.offs.Claim(h.ctx, []sinks.TP{h.tp})
	if err != nil {
		t.Fatal(err)
	}
	if again[0].NextOffset == nil || *again[0].NextOffset != 7 || again[0].Epoch <= cs[0].Epoch {
		t.Fatalf("second claim = %+v, want offset 7 and an epoch above %d", again[0], cs[0].Epoch)
	}
	// A stale claim sets nothing.
	if set, err := h.offs.InitAll(h.ctx, cs, []int64{3}); err != nil || len(set) != 0 {
		t.Errorf("InitAll by the stale claim = %v, %v; want nothing set", set, err)
	}
	// Another identity's offsets are its own.
	other, err := h.store.Offsets("other").Claim(h.ctx, []sinks.TP{h.tp})
	if err != nil || other[0].NextOffset != nil {
		t.Errorf("another identity's claim = %+v, %v; want nothing stored", other, err)
	}
}

func commitWrites(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	h.mustCommit(&c, 5, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10), upsert("a2", 3, "bob", 20)}})
	st := h.load("a1", "a2", "a3")
	if !same(st.Rows["a1"], row("a1", "ann", 10)) || st.Versions["a1"] != 1 {
		t.Errorf("a1 loaded as %v v%d, want ann's row at v1", st.Rows["a1"], st.Versions["a1"])
	}
	if !same(st.Rows["a2"], row("a2", "bob", 20)) || st.Versions["a2"] != 3 {
		t.Errorf("a2 loaded as %v v%d, want bob's row at v3", st.Rows["a2"], st.Versions["a2"])
	}
	if _, ok := st.Rows["a3"]; ok || st.Versions["a3"] != 0 {
		t.Errorf("a3 never written, loaded as %v v%d", st.Rows["a3"], st.Versions["a3"])
	}
	if next := h.stored(h.tp); next == nil || *next != 5 {
		t.Errorf("stored offset = %v, want 5", next)
	}
}

func newerOwnerFences(t *testing.T, h *harness) {
	stale := h.claim(h.offs, h.tp, 0)
	owner := h.claim(h.offs, h.tp, 0)
	err := h.commit(stale, 5, []string{"a1"}, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "mallory", 1)}})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Fatalf("commit by the older owner = %v, want ErrFenced", err)
	}
	if st := h.load("a1"); st.Rows["a1"] != nil || st.Versions["a1"] != 0 {
		t.Errorf("a fenced batch wrote a1: %v v%d", st.Rows["a1"], st.Versions["a1"])
	}
	h.mustCommit(&owner, 5, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
	// The older owner stays fenced, even from the current offset.
	stale.NextOffset = 5
	err = h.commit(stale, 6, []string{"a1"}, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 2, "mallory", 1)}})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Errorf("older owner from the current offset = %v, want ErrFenced", err)
	}
	if st := h.load("a1"); !same(st.Rows["a1"], row("a1", "ann", 10)) {
		t.Errorf("a1 = %v after a fenced batch, want ann's", st.Rows["a1"])
	}
}

func wrongStartFenced(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	wrong := c
	wrong.NextOffset = 3
	err := h.commit(wrong, 5, []string{"a1"}, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Fatalf("commit from an offset that is not the stored one = %v, want ErrFenced", err)
	}
	if next := h.stored(h.tp); next == nil || *next != 0 {
		t.Errorf("stored offset = %v, want 0", next)
	}
}

func uninitialisedFenced(t *testing.T, h *harness) {
	cs, err := h.offs.Claim(h.ctx, []sinks.TP{h.tp})
	if err != nil {
		t.Fatal(err)
	}
	err = h.commit(sinks.Claim{TP: h.tp, Epoch: cs[0].Epoch}, 1, []string{"a1"}, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Errorf("commit on a partition with no stored offset = %v, want ErrFenced", err)
	}
	if st := h.load("a1"); st.Rows["a1"] != nil {
		t.Errorf("a1 written by a fenced batch: %v", st.Rows["a1"])
	}
}

func planErrorWritesNothing(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	boom := errors.New("boom")
	err := h.sink.CommitBatch(h.ctx, c, 5, sinks.Keys{All: []string{"a1"}}, func(sinks.State) (sinks.Changes, error) {
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}}, fmt.Errorf("plan: %w", boom)
	})
	if !errors.Is(err, boom) {
		t.Fatalf("CommitBatch = %v, want the plan's error", err)
	}
	if st := h.load("a1"); st.Rows["a1"] != nil {
		t.Errorf("a failed plan wrote a1: %v", st.Rows["a1"])
	}
	// The offset did not move: the batch commits again from 0.
	h.mustCommit(&c, 5, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
}

// A worker writes only versions above the one it was given (the version
// gate ignores the others), so that is all the contract asks of a sink.
func newerVersionReplaces(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	h.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 5, "ann", 50)}})
	if st := h.load("a1"); !same(st.Rows["a1"], row("a1", "ann", 50)) || st.Versions["a1"] != 5 {
		t.Errorf("a1 = %v v%d, want ann's row at v5", st.Rows["a1"], st.Versions["a1"])
	}
	h.mustCommit(&c, 4, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 6, "newer", 60)}})
	if st := h.load("a1"); !same(st.Rows["a1"], row("a1", "newer", 60)) || st.Versions["a1"] != 6 {
		t.Errorf("a1 = %v v%d, want the newer row at v6", st.Rows["a1"], st.Versions["a1"])
	}
}

// A record tombstone deletes the row at the version it has: the delete
// carries the row's own version.
func tombstoneDeletes(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	h.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 2, "ann", 10)}})
	h.mustCommit(&c, 2, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a1", Version: 2}}})
	if st := h.load("a1"); st.Rows["a1"] != nil || st.Versions["a1"] != 2 {
		t.Errorf("a1 after its tombstone = %v v%d, want no row and version 2 kept", st.Rows["a1"], st.Versions["a1"])
	}
}

func deleteKeepsVersion(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	h.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
	h.mustCommit(&c, 2, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a1", Version: 4}}})
	st := h.load("a1")
	if _, ok := st.Rows["a1"]; ok || st.Versions["a1"] != 4 {
		t.Errorf("deleted a1 = %v v%d, want no row and its version 4 kept", st.Rows["a1"], st.Versions["a1"])
	}
	// An older delete does not lower the kept version.
	h.mustCommit(&c, 3, sinks.Changes{Deletes: []sinks.RowDelete{{Key: "a1", Version: 3}}})
	if st := h.load("a1"); st.Versions["a1"] != 4 {
		t.Errorf("a1's version after an older delete = %d, want 4", st.Versions["a1"])
	}
	// The aggregate comes back with a newer version.
	h.mustCommit(&c, 4, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 5, "ann2", 1)}})
	if st := h.load("a1"); !same(st.Rows["a1"], row("a1", "ann2", 1)) || st.Versions["a1"] != 5 {
		t.Errorf("recreated a1 = %v v%d, want its new row at v5", st.Rows["a1"], st.Versions["a1"])
	}
}

func parkedEvents(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 10)
	e1 := sinks.StoredEvent{Key: "a1", Version: 3, Offset: 10, RecordKey: []byte("a1"), Value: []byte{0, 1, 0xff},
		Headers: []sinks.Header{{Key: "trace", Value: []byte("abc")}}}
	e2 := sinks.StoredEvent{Key: "a1", Version: 4, Offset: 11, RecordKey: []byte("a1"), Value: []byte("x")}
	e3 := sinks.StoredEvent{Key: "a2", Version: 2, Offset: 12, RecordKey: []byte("a2"), Value: []byte("y")}
	h.mustCommit(&c, 13, sinks.Changes{Park: []sinks.StoredEvent{e1, e2, e3}})
	parked, err := h.sink.Parked(h.ctx, h.tp)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 2 || parked["a1"].Count != 2 || parked["a2"].Count != 1 {
		t.Errorf("Parked = %+v, want a1 ×2 and a2 ×1", parked)
	}
	st := h.load("a1")
	slices.SortFunc(st.Parked, func(a, b sinks.StoredEvent) int { return int(a.Version - b.Version) })
	if len(st.Parked) != 2 || st.Parked[0].Version != 3 || st.Parked[0].Offset != 10 ||
		string(st.Parked[0].Value) != string(e1.Value) || !reflect.DeepEqual(st.Parked[0].Headers, e1.Headers) || st.Parked[1].Version != 4 {
		t.Errorf("a1's parked events loaded as %+v, want v3 and v4 as parked", st.Parked)
	}
	// Parking the same version again keeps the first copy.
	dup := e1
	dup.Offset, dup.Value = 99, []byte("other")
	h.mustCommit(&c, 14, sinks.Changes{Park: []sinks.StoredEvent{dup}})
	if p, _ := h.sink.Parked(h.ctx, h.tp); p["a1"].Count != 2 {
		t.Errorf("after parking a duplicate, a1 has %d parked, want 2", p["a1"].Count)
	}
	// Parked events belong to their identity and partition.
	for _, other := range []struct {
		identity string
		tp       sinks.TP
	}{{"other", h.tp}, {identity, sinks.TP{Topic: h.tp.Topic, Partition: 1}}} {
		s, err := h.store.Sink(sinks.Target{Identity: other.identity, Projection: h.p})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := s.Parked(h.ctx, other.tp); err != nil || len(p) != 0 {
			t.Errorf("parked of %s %v = %v, %v; want none", other.identity, other.tp, p, err)
		}
	}
	h.mustCommit(&c, 15, sinks.Changes{Unpark: []sinks.ParkedRef{{Key: "a1", Version: 3}, {Key: "a1", Version: 4}, {Key: "a2", Version: 2}}})
	if p, err := h.sink.Parked(h.ctx, h.tp); err != nil || len(p) != 0 {
		t.Errorf("parked after unparking all = %v, %v; want none", p, err)
	}
}

func assumedNew(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	h.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})
	// The plan adds one to what it is given; a sink that plans on the
	// assumption that a1 is new must plan again once it finds it is not.
	keys := sinks.Keys{All: []string{"a1"}, New: []string{"a1"}}
	err := h.sink.CommitBatch(h.ctx, c, 2, keys, func(st sinks.State) (sinks.Changes, error) {
		v := st.Versions["a1"] + 1
		var balance int64 = 1
		if st.Rows["a1"] != nil {
			balance = 11
		}
		return sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", v, "ann", balance)}}, nil
	})
	if err != nil {
		t.Fatalf("commit with a1 assumed new: %v", err)
	}
	if st := h.load("a1"); !same(st.Rows["a1"], row("a1", "ann", 11)) || st.Versions["a1"] != 2 {
		t.Errorf("a1 = %v v%d, want the row planned from its stored state at v2", st.Rows["a1"], st.Versions["a1"])
	}
}

func peek(t *testing.T, h *harness) {
	pk, ok := h.sink.(sinks.Peeker)
	if !ok {
		t.Skip("the sink does not read state outside a batch")
	}
	c := h.claim(h.offs, h.tp, 0)
	h.mustCommit(&c, 2, sinks.Changes{
		Upserts: []sinks.RowWrite{upsert("a1", 2, "ann", 10)},
		Deletes: []sinks.RowDelete{{Key: "a2", Version: 3}},
		Park:    []sinks.StoredEvent{{Key: "a3", Version: 2, Offset: 1, RecordKey: []byte("a3"), Value: []byte("p")}},
	})
	st, err := pk.Peek(h.ctx, c, sinks.Keys{All: []string{"a1", "a2", "a3"}, Parked: []string{"a3"}})
	if err != nil {
		t.Fatal(err)
	}
	if !same(st.Rows["a1"], row("a1", "ann", 10)) || st.Versions["a1"] != 2 || st.Rows["a2"] != nil || st.Versions["a2"] != 3 {
		t.Errorf("Peek = rows %v versions %v, want a1 at v2 and a2 deleted at v3", st.Rows, st.Versions)
	}
	if len(st.Parked) != 1 || st.Parked[0].Key != "a3" {
		t.Errorf("Peek parked = %+v, want a3's event", st.Parked)
	}
}

func nothingToAdopt(t *testing.T, h *harness) {
	c := h.claim(h.offs, h.tp, 0)
	if _, ok, err := h.offs.Adopt(h.ctx, h.tp, c.Epoch); err != nil || ok {
		t.Errorf("Adopt without a reset = %v, %v; want nothing to adopt", ok, err)
	}
}

// lanes returns the sinks of both Projections, skipping the test when
// the sink cannot commit projections of one topic together.
func (h *harness) lanes() (sinks.LaneCommitter, sinks.Sink) {
	h.t.Helper()
	lc, ok := h.sink.(sinks.LaneCommitter)
	if !ok {
		h.t.Skip("the sink is no sinks.LaneCommitter: a topic feeds one projection")
	}
	other, err := h.store.Sink(sinks.Target{Identity: identity, Projection: Projections()[1]})
	if err != nil {
		h.t.Fatalf("sink of %s: %v", Projections()[1].Name, err)
	}
	return lc, other
}

func changes(ch sinks.Changes) func(sinks.State) (sinks.Changes, error) {
	return func(sinks.State) (sinks.Changes, error) { return ch, nil }
}

// Two projections of one topic: each gets its own rows, parked events and
// dead letters of one record, and the stored offset moves once.
func lanesCommit(t *testing.T, h *harness) {
	lc, other := h.lanes()
	c := h.claim(h.offs, h.tp, 0)
	park := sinks.StoredEvent{Key: "a2", Version: 3, Offset: 1, RecordKey: []byte("a2"), Value: []byte("x")}
	dead := sinks.DeadLetter{Offset: 2, RecordKey: []byte("a3"), Value: []byte{0xff}, Err: "decode: bad", Class: sinks.ClassDecode}
	err := lc.CommitLanes(h.ctx, c, 3, []sinks.Lane{
		{Sink: h.sink, Keys: sinks.Keys{All: []string{"a1", "a2"}}, Plan: changes(sinks.Changes{
			Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}, Park: []sinks.StoredEvent{park}, DeadLetters: []sinks.DeadLetter{dead}})},
		{Sink: other, Keys: sinks.Keys{All: []string{"a1", "a2"}}, Plan: changes(sinks.Changes{
			Upserts:     []sinks.RowWrite{{Key: "a1", Version: 1, Row: projection.Row{"id": "a1", "owner": "ann"}}},
			Park:        []sinks.StoredEvent{park},
			DeadLetters: []sinks.DeadLetter{dead}})},
	})
	if err != nil {
		t.Fatalf("CommitLanes: %v", err)
	}
	if st := h.load("a1"); !same(st.Rows["a1"], row("a1", "ann", 10)) {
		t.Errorf("first lane's a1 = %v, want ann/10", st.Rows["a1"])
	}
	st, err := other.Load(h.ctx, h.tp, []string{"a1", "a2"})
	if err != nil {
		t.Fatal(err)
	}
	// The second projection's fold does not read rows: a sink may say
	// only that the row exists.
	if _, has := st.Rows["a1"]; !has || st.Versions["a1"] != 1 {
		t.Errorf("second lane's a1 = %v v%d, want a row at v1", st.Rows["a1"], st.Versions["a1"])
	}
	for i, s := range []sinks.Sink{h.sink, other} {
		p, err := s.Parked(h.ctx, h.tp)
		if err != nil || p["a2"].Count != 1 {
			t.Errorf("lane %d: parked = %v, %v; want a2's one event in each projection", i, p, err)
		}
	}
	// Unparked in one projection, it stays parked in the other.
	c.NextOffset = 3
	if err := lc.CommitLanes(h.ctx, c, 4, []sinks.Lane{
		{Sink: h.sink, Keys: sinks.Keys{All: []string{"a2"}, Parked: []string{"a2"}}, Plan: changes(sinks.Changes{Unpark: []sinks.ParkedRef{{Key: "a2", Version: 3}}})},
		{Sink: other, Keys: sinks.Keys{All: []string{"a2"}, Parked: []string{"a2"}}, Plan: changes(sinks.Changes{})},
	}); err != nil {
		t.Fatalf("CommitLanes: %v", err)
	}
	if p, _ := h.sink.Parked(h.ctx, h.tp); len(p) != 0 {
		t.Errorf("first lane's parked after its unpark = %v, want none", p)
	}
	if p, _ := other.Parked(h.ctx, h.tp); p["a2"].Count != 1 {
		t.Errorf("second lane's parked after the first lane's unpark = %v, want a2's event", p)
	}
	if next := h.stored(h.tp); next == nil || *next != 4 {
		t.Errorf("stored offset = %v, want 4", next)
	}
}

// A lane whose plan fails writes nothing in any lane, nor the offset.
func laneFailure(t *testing.T, h *harness) {
	lc, other := h.lanes()
	c := h.claim(h.offs, h.tp, 0)
	boom := errors.New("boom")
	err := lc.CommitLanes(h.ctx, c, 5, []sinks.Lane{
		{Sink: h.sink, Keys: sinks.Keys{All: []string{"a1"}}, Plan: changes(sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})},
		{Sink: other, Keys: sinks.Keys{All: []string{"a1"}}, Plan: func(sinks.State) (sinks.Changes, error) { return sinks.Changes{}, boom }},
	})
	if !errors.Is(err, boom) {
		t.Fatalf("CommitLanes = %v, want the second lane's plan error", err)
	}
	if st := h.load("a1"); st.Rows["a1"] != nil {
		t.Errorf("the first lane wrote a1 although the second failed: %v", st.Rows["a1"])
	}
	h.mustCommit(&c, 5, sinks.Changes{}) // the offset did not move: it commits from 0
}

// A newer owner fences every lane of the partition at once.
func lanesFenced(t *testing.T, h *harness) {
	lc, other := h.lanes()
	old := h.claim(h.offs, h.tp, 0)
	h.claim(h.offs, h.tp, 0)
	err := lc.CommitLanes(h.ctx, old, 5, []sinks.Lane{
		{Sink: h.sink, Keys: sinks.Keys{All: []string{"a1"}}, Plan: changes(sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 10)}})},
		{Sink: other, Keys: sinks.Keys{All: []string{"a1"}}, Plan: changes(sinks.Changes{Upserts: []sinks.RowWrite{{Key: "a1", Version: 1, Row: projection.Row{"id": "a1", "owner": "ann"}}}})},
	})
	if !errors.Is(err, sinks.ErrFenced) {
		t.Fatalf("CommitLanes of the older owner = %v, want ErrFenced", err)
	}
	if st := h.load("a1"); st.Rows["a1"] != nil {
		t.Errorf("a fenced commit wrote a1: %v", st.Rows["a1"])
	}
	if st, err := other.Load(h.ctx, h.tp, []string{"a1"}); err != nil || st.Rows["a1"] != nil {
		t.Errorf("a fenced commit wrote a1 of the second lane: %v, %v", st.Rows["a1"], err)
	}
}
