package versioning

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// ev is the test event. It records its own version and which copy it is, so
// the tests can check the order of applies and which copy was applied.
type ev struct {
	v   int64 // version carried by the event
	seq int   // which copy: position in the input stream; negative for decoys that must never apply
	agg int   // aggregate key (property and fuzz tests)
}

// at is the event of version v that is copy seq.
func at(v int64, seq int) ev { return ev{v: v, seq: seq} }

var errPoison = errors.New("poisoned event")

// recorder is an apply callback that records what it applied and fails for
// the copies listed in failSeq.
type recorder struct {
	t       *testing.T
	applied []ev
	failed  []ev
	failSeq map[int]bool
}

func (r *recorder) apply(v int64, e ev) error {
	if e.v != v {
		r.t.Errorf("apply called with version %d for the event of version %d", v, e.v)
	}
	if r.failSeq[e.seq] {
		r.failed = append(r.failed, e)
		return errPoison
	}
	r.applied = append(r.applied, e)
	return nil
}

// parkedOf lists the parked events in version order, checking that each is
// parked under its own version.
func parkedOf(tb interface{ Fatalf(string, ...any) }, a *Aggregate[ev]) []ev {
	var out []ev
	a.EachParked(func(v int64, e ev) {
		if e.v != v {
			tb.Fatalf("event of version %d parked under version %d", e.v, v)
		}
		out = append(out, e)
	})
	if len(out) != a.ParkedCount() {
		tb.Fatalf("EachParked visited %d events, ParkedCount is %d", len(out), a.ParkedCount())
	}
	slices.SortFunc(out, func(x, y ev) int { return cmp.Compare(x.v, y.v) })
	return out
}

// checkState compares the gate with the expected version, parked events and
// missing version.
func checkState(t *testing.T, a *Aggregate[ev], version int64, parked []ev, missing int64) {
	t.Helper()
	if a.Version != version {
		t.Errorf("Version = %d, want %d", a.Version, version)
	}
	if got := parkedOf(t, a); !slices.Equal(got, parked) {
		t.Errorf("parked = %v, want %v", got, parked)
	}
	if got := a.Missing(); got != missing {
		t.Errorf("Missing() = %d, want %d", got, missing)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[Outcome]string{
		Applied:    "applied",
		Stale:      "stale",
		Parked:     "parked",
		0:          "unknown",
		Parked + 1: "unknown",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", o, got, want)
		}
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		current, v int64
		want       Outcome
	}{
		{0, 1, Applied},
		{0, 2, Parked},
		{0, 0, Stale},
		{0, -1, Stale},
		{5, 6, Applied},
		{5, 7, Parked},
		{5, 5, Stale},
		{5, 4, Stale},
		{5, 1, Stale},
		{5, math.MaxInt64, Parked},
		{math.MaxInt64 - 1, math.MaxInt64, Applied},
		{math.MaxInt64, math.MaxInt64, Stale},
		{math.MaxInt64, 1, Stale},
	}
	for _, tt := range tests {
		if got := Decide(tt.current, tt.v); got != tt.want {
			t.Errorf("Decide(%d, %d) = %v, want %v", tt.current, tt.v, got, tt.want)
		}
	}
}

// step offers one event; its copy number (seq) is its index in the steps.
type step struct {
	v       int64
	want    Outcome
	fail    bool // apply fails for this copy
	wantErr bool // Offer returns the apply error
}

// TestOffer runs sequences of Restore and Offer calls against one aggregate.
func TestOffer(t *testing.T) {
	tests := []struct {
		name    string
		version int64 // starting Version
		restore []ev  // restored, in this order, before the steps
		failSeq []int // restored copies whose apply fails
		steps   []step

		wantApplied []ev
		wantFailed  []ev
		wantVersion int64
		wantParked  []ev
		wantMissing int64
	}{
		{
			name:        "in order",
			steps:       []step{{v: 1, want: Applied}, {v: 2, want: Applied}, {v: 3, want: Applied}},
			wantApplied: []ev{at(1, 0), at(2, 1), at(3, 2)},
			wantVersion: 3,
		},
		{
			name: "duplicates are stale",
			steps: []step{
				{v: 1, want: Applied}, {v: 1, want: Stale}, {v: 2, want: Applied},
				{v: 2, want: Stale}, {v: 1, want: Stale},
			},
			wantApplied: []ev{at(1, 0), at(2, 2)},
			wantVersion: 2,
		},
		{
			name:        "non-positive versions are stale",
			steps:       []step{{v: 0, want: Stale}, {v: -1, want: Stale}, {v: math.MinInt64, want: Stale}},
			wantVersion: 0,
		},
		{
			name:        "swapped pair",
			steps:       []step{{v: 2, want: Parked}, {v: 1, want: Applied}, {v: 3, want: Applied}},
			wantApplied: []ev{at(1, 1), at(2, 0), at(3, 2)},
			wantVersion: 3,
		},
		{
			name: "reverse order drains in version order",
			steps: []step{
				{v: 4, want: Parked}, {v: 3, want: Parked}, {v: 2, want: Parked}, {v: 1, want: Applied},
			},
			wantApplied: []ev{at(1, 3), at(2, 2), at(3, 1), at(4, 0)},
			wantVersion: 4,
		},
		{
			name:        "gap waits",
			steps:       []step{{v: 1, want: Applied}, {v: 3, want: Parked}, {v: 4, want: Parked}, {v: 6, want: Parked}},
			wantApplied: []ev{at(1, 0)},
			wantVersion: 1,
			wantParked:  []ev{at(3, 1), at(4, 2), at(6, 3)},
			wantMissing: 2,
		},
		{
			name: "gap then fill drains up to the next gap",
			steps: []step{
				{v: 1, want: Applied}, {v: 3, want: Parked}, {v: 4, want: Parked}, {v: 6, want: Parked},
				{v: 2, want: Applied},
			},
			wantApplied: []ev{at(1, 0), at(2, 4), at(3, 1), at(4, 2)},
			wantVersion: 4,
			wantParked:  []ev{at(6, 3)},
			wantMissing: 5,
		},
		{
			name: "duplicate of a parked version is stale and the first copy wins",
			steps: []step{
				{v: 3, want: Parked}, {v: 3, want: Stale}, {v: 1, want: Applied},
				{v: 3, want: Stale}, {v: 2, want: Applied}, {v: 3, want: Stale},
			},
			wantApplied: []ev{at(1, 2), at(2, 4), at(3, 0)},
			wantVersion: 3,
		},
		{
			// The outcome is the decision (the version was the next one); the
			// error says the apply failed.
			name: "apply error on the offered event",
			steps: []step{
				{v: 1, want: Applied}, {v: 3, want: Parked}, {v: 4, want: Parked},
				{v: 2, want: Applied, fail: true, wantErr: true},
			},
			wantApplied: []ev{at(1, 0)},
			wantFailed:  []ev{at(2, 3)},
			wantVersion: 1,
			wantParked:  []ev{at(3, 1), at(4, 2)},
			wantMissing: 2,
		},
		{
			name: "apply error then a later copy of the version applies",
			steps: []step{
				{v: 1, want: Applied}, {v: 3, want: Parked},
				{v: 2, want: Applied, fail: true, wantErr: true},
				{v: 2, want: Applied},
			},
			wantApplied: []ev{at(1, 0), at(2, 3), at(3, 1)},
			wantFailed:  []ev{at(2, 2)},
			wantVersion: 3,
		},
		{
			name: "apply error while draining: the failed event leaves, later ones stay parked",
			steps: []step{
				{v: 3, want: Parked, fail: true}, {v: 4, want: Parked}, {v: 6, want: Parked},
				{v: 2, want: Parked}, {v: 1, want: Applied, wantErr: true},
			},
			wantApplied: []ev{at(1, 4), at(2, 3)},
			wantFailed:  []ev{at(3, 0)},
			wantVersion: 2,
			wantParked:  []ev{at(4, 1), at(6, 2)},
			wantMissing: 3,
		},
		{
			name: "after a drain error a new copy of the failed version resumes the drain",
			steps: []step{
				{v: 2, want: Parked, fail: true}, {v: 3, want: Parked},
				{v: 1, want: Applied, wantErr: true},
				{v: 2, want: Applied},
			},
			wantApplied: []ev{at(1, 2), at(2, 3), at(3, 1)},
			wantFailed:  []ev{at(2, 0)},
			wantVersion: 3,
		},
		{
			name:        "starting from a persisted version",
			version:     10,
			steps:       []step{{v: 9, want: Stale}, {v: 10, want: Stale}, {v: 12, want: Parked}, {v: 11, want: Applied}},
			wantApplied: []ev{at(11, 3), at(12, 2)},
			wantVersion: 12,
		},

		// Restore.
		{
			name:        "restore drops versions at or below Version",
			version:     5,
			restore:     []ev{at(3, 100), at(5, 101), at(0, 102), at(7, 103)},
			wantVersion: 5,
			wantParked:  []ev{at(7, 103)},
			wantMissing: 6,
		},
		{
			name:        "restore keeps the first copy",
			version:     1,
			restore:     []ev{at(4, 100), at(3, 101), at(4, 102), at(3, 103)},
			steps:       []step{{v: 2, want: Applied}},
			wantApplied: []ev{at(2, 0), at(3, 101), at(4, 100)},
			wantVersion: 4,
		},
		{
			name:    "offer of a restored version is stale",
			version: 1,
			restore: []ev{at(3, 100)},
			steps: []step{
				{v: 3, want: Stale}, {v: 4, want: Parked}, {v: 2, want: Applied}, {v: 3, want: Stale},
			},
			wantApplied: []ev{at(2, 2), at(3, 100), at(4, 1)},
			wantVersion: 4,
		},
		{
			name:        "restore into the zero value",
			restore:     []ev{at(2, 100)},
			steps:       []step{{v: 1, want: Applied}},
			wantApplied: []ev{at(1, 0), at(2, 100)},
			wantVersion: 2,
		},
		{
			name:        "restored event whose apply fails leaves the gate",
			version:     1,
			restore:     []ev{at(3, 100), at(4, 101)},
			failSeq:     []int{100},
			steps:       []step{{v: 2, want: Applied, wantErr: true}},
			wantApplied: []ev{at(2, 0)},
			wantFailed:  []ev{at(3, 100)},
			wantVersion: 2,
			wantParked:  []ev{at(4, 101)},
			wantMissing: 3,
		},
		{
			// A restored event at exactly Version+1 cannot drain by itself
			// (Restore has no apply); when that version is offered again the
			// offered copy applies, and the restored copy must not stay
			// behind as a phantom parked event below Version.
			name:        "restored next version then offered again",
			version:     1,
			restore:     []ev{at(2, 100), at(3, 101)},
			steps:       []step{{v: 2, want: Applied}},
			wantApplied: []ev{at(2, 0), at(3, 101)},
			wantVersion: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{t: t, failSeq: map[int]bool{}}
			for _, seq := range tt.failSeq {
				r.failSeq[seq] = true
			}
			for seq, s := range tt.steps {
				if s.fail {
					r.failSeq[seq] = true
				}
			}

			a := &Aggregate[ev]{Version: tt.version}
			for _, e := range tt.restore {
				a.Restore(e.v, e)
			}
			for seq, s := range tt.steps {
				got, err := a.Offer(s.v, at(s.v, seq), r.apply)
				if got != s.want {
					t.Errorf("step %d: Offer(%d) = %v, want %v", seq, s.v, got, s.want)
				}
				if s.wantErr != (err != nil) || (err != nil && !errors.Is(err, errPoison)) {
					t.Errorf("step %d: Offer(%d) error = %v, want error: %t", seq, s.v, err, s.wantErr)
				}
			}

			if !slices.Equal(r.applied, tt.wantApplied) {
				t.Errorf("applied %v, want %v", r.applied, tt.wantApplied)
			}
			if !slices.Equal(r.failed, tt.wantFailed) {
				t.Errorf("failed %v, want %v", r.failed, tt.wantFailed)
			}
			checkState(t, a, tt.wantVersion, tt.wantParked, tt.wantMissing)
		})
	}
}

func TestJump(t *testing.T) {
	tests := []struct {
		name    string
		version int64
		park    []ev // restored before the jump
		failSeq []int
		to      int64

		wantDropped []ev
		wantApplied []ev
		wantErr     bool
		wantVersion int64
		wantParked  []ev
		wantMissing int64
	}{
		{
			name:        "drops superseded parked events",
			version:     1,
			park:        []ev{at(3, 0), at(4, 1), at(7, 2), at(8, 3)},
			to:          4,
			wantDropped: []ev{at(3, 0), at(4, 1)},
			wantVersion: 4,
			wantParked:  []ev{at(7, 2), at(8, 3)},
			wantMissing: 5,
		},
		{
			name:        "drains the parked events that became contiguous",
			version:     1,
			park:        []ev{at(3, 0), at(5, 1), at(6, 2), at(8, 3)},
			to:          4,
			wantDropped: []ev{at(3, 0)},
			wantApplied: []ev{at(5, 1), at(6, 2)},
			wantVersion: 6,
			wantParked:  []ev{at(8, 3)},
			wantMissing: 7,
		},
		{
			name:        "over a gap with nothing parked",
			version:     3,
			to:          10,
			wantVersion: 10,
		},
		{
			name:        "jump past every parked event",
			park:        []ev{at(2, 0), at(5, 1)},
			to:          9,
			wantDropped: []ev{at(2, 0), at(5, 1)},
			wantVersion: 9,
		},
		{
			name:        "backwards is a no-op",
			version:     5,
			park:        []ev{at(7, 0)},
			to:          3,
			wantVersion: 5,
			wantParked:  []ev{at(7, 0)},
			wantMissing: 6,
		},
		{
			name:        "to the current version is a no-op",
			version:     5,
			park:        []ev{at(7, 0)},
			to:          5,
			wantVersion: 5,
			wantParked:  []ev{at(7, 0)},
			wantMissing: 6,
		},
		{
			name:        "apply error while draining",
			version:     1,
			park:        []ev{at(3, 0), at(5, 1), at(6, 2)},
			failSeq:     []int{1},
			to:          4,
			wantDropped: []ev{at(3, 0)},
			wantErr:     true,
			wantVersion: 4,
			wantParked:  []ev{at(6, 2)},
			wantMissing: 5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{t: t, failSeq: map[int]bool{}}
			for _, seq := range tt.failSeq {
				r.failSeq[seq] = true
			}
			a := &Aggregate[ev]{Version: tt.version}
			for _, e := range tt.park {
				a.Restore(e.v, e)
			}
			var dropped []ev
			drop := func(v int64, e ev) {
				if e.v != v {
					t.Errorf("drop called with version %d for the event of version %d", v, e.v)
				}
				dropped = append(dropped, e)
			}

			err := a.Jump(tt.to, drop, r.apply)
			if tt.wantErr != (err != nil) || (err != nil && !errors.Is(err, errPoison)) {
				t.Errorf("Jump(%d) error = %v, want error: %t", tt.to, err, tt.wantErr)
			}

			slices.SortFunc(dropped, func(x, y ev) int { return cmp.Compare(x.v, y.v) }) // drop order is unspecified
			if !slices.Equal(dropped, tt.wantDropped) {
				t.Errorf("dropped %v, want %v", dropped, tt.wantDropped)
			}
			if !slices.Equal(r.applied, tt.wantApplied) {
				t.Errorf("applied %v, want %v", r.applied, tt.wantApplied)
			}
			checkState(t, a, tt.wantVersion, tt.wantParked, tt.wantMissing)
		})
	}
}

func TestJumpNilDrop(t *testing.T) {
	r := &recorder{t: t}
	a := &Aggregate[ev]{}
	a.Restore(2, at(2, 0))
	a.Restore(4, at(4, 1))
	if err := a.Jump(3, nil, r.apply); err != nil {
		t.Fatalf("Jump: %v", err)
	}
	if want := []ev{at(4, 1)}; !slices.Equal(r.applied, want) {
		t.Errorf("applied %v, want %v", r.applied, want)
	}
	checkState(t, a, 4, nil, 0)
}

// TestOfferInOrderDoesNotAllocate pins what BenchmarkOffer shows: the
// in-order path and the stale path allocate nothing.
func TestOfferInOrderDoesNotAllocate(t *testing.T) {
	var a Aggregate[ev]
	var n int
	apply := func(int64, ev) error { n++; return nil }
	var v int64
	allocs := testing.AllocsPerRun(1000, func() {
		v++
		a.Offer(v, ev{v: v}, apply)
		a.Offer(v, ev{v: v}, apply) // duplicate: stale
	})
	if allocs != 0 {
		t.Errorf("in-order Offer allocates %v times per event, want 0", allocs)
	}
	if int64(n) != v || a.Version != v {
		t.Errorf("applied %d of %d events, Version %d", n, v, a.Version)
	}
}

func BenchmarkOffer(b *testing.B) {
	b.Run("in-order", func(b *testing.B) {
		var a Aggregate[ev]
		var sum int64
		apply := func(v int64, _ ev) error { sum += v; return nil }
		b.ReportAllocs()
		for v := int64(1); b.Loop(); v++ {
			if _, err := a.Offer(v, ev{v: v}, apply); err != nil {
				b.Fatal(err)
			}
		}
		_ = sum
	})
	b.Run("swapped-pairs", func(b *testing.B) {
		// Every other event parks and drains with the next one: 2, 1, 4, 3, ...
		var a Aggregate[ev]
		var sum int64
		apply := func(v int64, _ ev) error { sum += v; return nil }
		b.ReportAllocs()
		for i := int64(0); b.Loop(); i++ {
			v := (i ^ 1) + 1
			if _, err := a.Offer(v, ev{v: v}, apply); err != nil {
				b.Fatal(err)
			}
		}
		_ = sum
	})
}

// ---- property and fuzz tests ----------------------------------------------

// failer is what the harness needs from *testing.T and *rapid.T.
type failer interface {
	Helper()
	Fatalf(format string, args ...any)
}

// harness feeds events for several aggregates to their gates, the way a
// partition worker does, checking every decision and the gate's invariants
// as it goes. poison[agg] is a version whose apply always fails.
type harness struct {
	t       failer
	gates   map[int]*Aggregate[ev]
	applied map[int][]ev
	errs    map[int]int
	poison  map[int]int64
	apply   func(v int64, e ev) error // one callback for all offers
}

func newHarness(t failer, poison map[int]int64) *harness {
	h := &harness{
		t:       t,
		gates:   map[int]*Aggregate[ev]{},
		applied: map[int][]ev{},
		errs:    map[int]int{},
		poison:  poison,
	}
	h.apply = func(v int64, e ev) error {
		if e.v != v {
			h.t.Fatalf("aggregate %d: apply called with version %d for the event of version %d", e.agg, v, e.v)
		}
		if e.seq < 0 {
			h.t.Fatalf("aggregate %d: decoy %v applied", e.agg, e)
		}
		if h.poison[e.agg] == v {
			return errPoison
		}
		h.applied[e.agg] = append(h.applied[e.agg], e)
		return nil
	}
	return h
}

func (h *harness) gate(agg int) *Aggregate[ev] {
	g, ok := h.gates[agg]
	if !ok {
		g = &Aggregate[ev]{}
		h.gates[agg] = g
	}
	return g
}

func (h *harness) offer(e ev) {
	h.t.Helper()
	g := h.gate(e.agg)
	before := g.Version
	wasParked := slices.ContainsFunc(parkedOf(h.t, g), func(p ev) bool { return p.v == e.v })

	got, err := g.Offer(e.v, e, h.apply)

	want := Decide(before, e.v)
	if want == Parked && wasParked {
		want = Stale
	}
	if got != want {
		h.t.Fatalf("aggregate %d at version %d: Offer(%v) = %v, want %v", e.agg, before, e, got, want)
	}
	if err != nil {
		if got != Applied || !errors.Is(err, errPoison) {
			h.t.Fatalf("aggregate %d: Offer(%v) = %v, %v", e.agg, e, got, err)
		}
		h.errs[e.agg]++
	}
	h.checkInvariants(e.agg)
}

// checkInvariants: parked events are beyond the next version (else they
// would have drained), are real events, and Missing agrees.
func (h *harness) checkInvariants(agg int) {
	h.t.Helper()
	g := h.gates[agg]
	parked := parkedOf(h.t, g)
	for _, p := range parked {
		if p.v <= g.Version+1 {
			h.t.Fatalf("aggregate %d at version %d: %v still parked", agg, g.Version, p)
		}
		if p.seq < 0 {
			h.t.Fatalf("aggregate %d: decoy %v parked", agg, p)
		}
	}
	var missing int64
	if len(parked) > 0 {
		missing = g.Version + 1
	}
	if g.Missing() != missing {
		h.t.Fatalf("aggregate %d: Missing() = %d, want %d", agg, g.Missing(), missing)
	}
}

// restart persists every gate (Version and parked events) and rebuilds it
// from that state, as after a process restart between batches. With decoys
// it also restores a second copy of each parked event and some events at or
// below Version: all must be dropped.
func (h *harness) restart(decoys bool) {
	h.t.Helper()
	for _, agg := range slices.Sorted(maps.Keys(h.gates)) {
		old := h.gates[agg]
		parked := parkedOf(h.t, old)

		g := &Aggregate[ev]{Version: old.Version}
		for _, p := range slices.Backward(parked) {
			g.Restore(p.v, p)
		}
		if decoys {
			for _, p := range parked {
				g.Restore(p.v, ev{v: p.v, seq: -1, agg: agg})
			}
			for v := old.Version; v >= old.Version-2; v-- {
				g.Restore(v, ev{v: v, seq: -2, agg: agg})
			}
		}
		h.gates[agg] = g
		if got := parkedOf(h.t, g); !slices.Equal(got, parked) {
			h.t.Fatalf("aggregate %d: restored %v, persisted %v", agg, got, parked)
		}
		h.checkInvariants(agg)
	}
}

// referenceFold says, independently of the gate, how one aggregate must end
// after its stream: every copy but the first of a version is a duplicate;
// versions 1..k apply in order, k being the largest version with all of 1..k
// in the stream (or poison-1 if the poisoned version is reached first); the
// first copies of the other versions stay parked, except a poisoned version
// that was reached (its copies failed and left the gate).
func referenceFold(stream []ev, poison int64) (applied, parked []ev, wantErr bool) {
	first := map[int64]ev{}
	for _, e := range stream {
		if _, seen := first[e.v]; !seen && e.v >= 1 {
			first[e.v] = e
		}
	}
	var k int64
	for {
		if _, ok := first[k+1]; !ok {
			break
		}
		k++
	}
	if poison >= 1 && poison <= k {
		k = poison - 1
		wantErr = true
	}
	for v := int64(1); v <= k; v++ {
		applied = append(applied, first[v])
	}
	for v, e := range first {
		if v > k && !(wantErr && v == poison) {
			parked = append(parked, e)
		}
	}
	slices.SortFunc(parked, func(x, y ev) int { return cmp.Compare(x.v, y.v) })
	return applied, parked, wantErr
}

// runScenario feeds events (seq must be their index) to a harness,
// restarting before the indexes in restartBefore (len(events) restarts at
// the end), and compares every aggregate with the reference fold.
func runScenario(t failer, events []ev, restartBefore map[int]bool, poison map[int]int64, decoys bool) {
	t.Helper()
	h := newHarness(t, poison)
	for i, e := range events {
		if restartBefore[i] {
			h.restart(decoys)
		}
		h.offer(e)
	}
	if restartBefore[len(events)] {
		h.restart(decoys)
	}

	streams := map[int][]ev{}
	for _, e := range events {
		streams[e.agg] = append(streams[e.agg], e)
	}
	for agg, stream := range streams {
		wantApplied, wantParked, wantErr := referenceFold(stream, poison[agg])
		g := h.gates[agg]
		if !slices.Equal(h.applied[agg], wantApplied) {
			t.Fatalf("aggregate %d: applied %v, want %v", agg, h.applied[agg], wantApplied)
		}
		if want := int64(len(wantApplied)); g.Version != want {
			t.Fatalf("aggregate %d: Version %d, want %d", agg, g.Version, want)
		}
		if got := parkedOf(t, g); !slices.Equal(got, wantParked) {
			t.Fatalf("aggregate %d: parked %v, want %v", agg, got, wantParked)
		}
		if g.ParkedCount() != len(wantParked) {
			t.Fatalf("aggregate %d: ParkedCount %d, want %d", agg, g.ParkedCount(), len(wantParked))
		}
		if (h.errs[agg] > 0) != wantErr {
			t.Fatalf("aggregate %d: %d apply errors, want some: %t", agg, h.errs[agg], wantErr)
		}
	}
}

// drawStream draws the versions one aggregate's events carry: 1..n, maybe
// with some versions missing, each present version one to three times, in
// order, locally reordered or shuffled.
func drawStream(t *rapid.T, agg int) []int64 {
	label := func(s string) string { return fmt.Sprintf("aggregate %d: %s", agg, s) }
	n := rapid.IntRange(0, 30).Draw(t, label("n"))
	var gaps []int64
	if n > 0 && rapid.Bool().Draw(t, label("has gaps")) {
		gaps = rapid.SliceOfNDistinct(rapid.Int64Range(1, int64(n)), 1, 3, rapid.ID).Draw(t, label("gaps"))
	}
	var stream []int64
	for v := int64(1); v <= int64(n); v++ {
		if slices.Contains(gaps, v) {
			continue
		}
		for range rapid.IntRange(1, 3).Draw(t, label("copies")) {
			stream = append(stream, v)
		}
	}
	if len(stream) < 2 {
		return stream
	}
	switch rapid.SampledFrom([]string{"in order", "local swaps", "shuffle"}).Draw(t, label("order")) {
	case "local swaps":
		for range rapid.IntRange(1, len(stream)).Draw(t, label("swaps")) {
			i := rapid.IntRange(0, len(stream)-2).Draw(t, label("swap at"))
			j := rapid.IntRange(i+1, min(i+4, len(stream)-1)).Draw(t, label("swap with"))
			stream[i], stream[j] = stream[j], stream[i]
		}
	case "shuffle":
		stream = rapid.Permutation(stream).Draw(t, label("shuffled"))
	}
	return stream
}

func TestGateMatchesReferenceFold(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		aggs := rapid.IntRange(1, 3).Draw(t, "aggregates")
		streams := make([][]int64, aggs)
		poison := map[int]int64{}
		for agg := range aggs {
			streams[agg] = drawStream(t, agg)
			if rapid.IntRange(0, 4).Draw(t, fmt.Sprintf("aggregate %d: poisoned", agg)) == 0 {
				poison[agg] = rapid.Int64Range(1, 31).Draw(t, fmt.Sprintf("aggregate %d: poison", agg))
			}
		}

		// Interleave the aggregates' streams as in one partition.
		var events []ev
		for {
			var live []int
			for agg, s := range streams {
				if len(s) > 0 {
					live = append(live, agg)
				}
			}
			if len(live) == 0 {
				break
			}
			agg := live[0]
			if len(live) > 1 {
				agg = rapid.SampledFrom(live).Draw(t, "next aggregate")
			}
			events = append(events, ev{v: streams[agg][0], seq: len(events), agg: agg})
			streams[agg] = streams[agg][1:]
		}

		restartBefore := map[int]bool{}
		for _, i := range rapid.SliceOfNDistinct(rapid.IntRange(0, len(events)), 0, 4, rapid.ID).Draw(t, "restart before") {
			restartBefore[i] = true
		}
		runScenario(t, events, restartBefore, poison, rapid.Bool().Draw(t, "decoys"))
	})
}
