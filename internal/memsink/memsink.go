// Package memsink is a sink and offset store held in memory: a second
// implementation of the sinks contract, so that the contract is what the
// engine and its conformance suite rely on rather than Postgres's
// behaviour. It keeps rows, versions kept aside after deletes, parked
// events, dead letters and stored offsets under one lock, each batch
// applied whole or not at all.
//
// It is for tests: nothing it holds survives the process.
package memsink

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// Store holds every projection's table and every identity's offsets and
// parked events. The zero value is not usable: call New.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	offsets map[offsetKey]*stored
	tables  map[string]*table // by table name
	parked  map[partKey]map[parkedKey]parkedEvent
	dead    []sinks.DeadLetter
}

type offsetKey struct {
	identity string
	tp       sinks.TP
}

type stored struct {
	epoch int64
	next  *int64
}

// partKey names one projection's parked events of a partition.
type partKey struct {
	identity   string
	projection string
	tp         sinks.TP
}

type parkedKey struct {
	key     string
	version int64
}

type parkedEvent struct {
	ev sinks.StoredEvent
	at time.Time
}

// table is one projection's rows and the versions its deleted aggregates
// keep.
type table struct {
	rows  map[string]version
	tombs map[string]int64
}

type version struct {
	v   int64
	row projection.Row
}

// New returns an empty store; now is its clock (nil: time.Now).
func New(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{
		now:     now,
		offsets: map[offsetKey]*stored{},
		tables:  map[string]*table{},
		parked:  map[partKey]map[parkedKey]parkedEvent{},
	}
}

// Offsets returns the offset store of a consumer identity.
func (s *Store) Offsets(identity string) sinks.Offsets {
	return &offsets{s: s, identity: identity}
}

// Sink returns the sink of one projection of a consumer identity.
func (s *Store) Sink(t sinks.Target) (sinks.Sink, error) {
	if t.Projection == nil {
		return nil, fmt.Errorf("memory sink of identity %q: no projection", t.Identity)
	}
	return &Sink{s: s, identity: t.Identity, name: t.Projection.Name, table: t.Projection.Table}, nil
}

// Ping reports that the store answers: it always does.
func (s *Store) Ping(context.Context) error { return nil }

// Rows returns a copy of the rows of a table, by aggregate key, with
// their versions.
func (s *Store) Rows(name string) (map[string]projection.Row, map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rows, versions := map[string]projection.Row{}, map[string]int64{}
	if t := s.tables[name]; t != nil {
		for k, r := range t.rows {
			rows[k], versions[k] = maps.Clone(r.row), r.v
		}
	}
	return rows, versions
}

// NextOffset returns the stored next offset of a partition of identity
// (ok false: none stored).
func (s *Store) NextOffset(identity string, tp sinks.TP) (next int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.offsets[offsetKey{identity, tp}]
	if o == nil || o.next == nil {
		return 0, false
	}
	return *o.next, true
}

// ParkedCount counts the events of identity parked in every partition.
func (s *Store) ParkedCount(identity string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for pk, evs := range s.parked {
		if pk.identity == identity {
			n += len(evs)
		}
	}
	return n
}

// DeadLetters returns the dead letters written so far, in the order
// their batches committed.
func (s *Store) DeadLetters() []sinks.DeadLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.dead)
}

func (s *Store) table(name string) *table {
	t := s.tables[name]
	if t == nil {
		t = &table{rows: map[string]version{}, tombs: map[string]int64{}}
		s.tables[name] = t
	}
	return t
}

// load reads the state of keys and the parked events of parked, as a
// batch sees it (under s.mu). Rows are copies: the plan folds into them.
func (s *Store) load(identity, proj, name string, tp sinks.TP, keys, parked []string) sinks.State {
	t := s.table(name)
	st := sinks.State{Rows: make(map[string]projection.Row, len(keys)), Versions: make(map[string]int64, len(keys))}
	for _, k := range keys {
		r, has := t.rows[k]
		if has {
			st.Rows[k] = maps.Clone(r.row)
		}
		if v := max(r.v, t.tombs[k]); has || v > 0 {
			st.Versions[k] = v
		}
	}
	if len(parked) > 0 {
		want := make(map[string]bool, len(parked))
		for _, k := range parked {
			want[k] = true
		}
		for pk, p := range s.parked[partKey{identity, proj, tp}] {
			if want[pk.key] {
				st.Parked = append(st.Parked, p.ev)
			}
		}
		slices.SortFunc(st.Parked, func(a, b sinks.StoredEvent) int { return int(a.Offset - b.Offset) })
	}
	return st
}

// Sink is one projection's sink of one identity.
type Sink struct {
	s        *Store
	identity string
	name     string // the projection's
	table    string
}

var (
	_ sinks.Sink          = (*Sink)(nil)
	_ sinks.Peeker        = (*Sink)(nil)
	_ sinks.LaneCommitter = (*Sink)(nil)
)

// CommitBatch implements sinks.Sink: the whole batch is planned and
// applied under the store's lock, so it is one transaction.
func (k *Sink) CommitBatch(ctx context.Context, claim sinks.Claim, end int64, keys sinks.Keys, plan func(sinks.State) (sinks.Changes, error)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit batch of %s/%d: %w", claim.Topic, claim.Partition, err)
	}
	return k.CommitLanes(ctx, claim, end, []sinks.Lane{{Sink: k, Keys: keys, Plan: plan}})
}

// CommitLanes implements sinks.LaneCommitter: every lane is planned, then
// all are applied, under the store's lock.
func (k *Sink) CommitLanes(ctx context.Context, claim sinks.Claim, end int64, lanes []sinks.Lane) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit batch of %s/%d: %w", claim.Topic, claim.Partition, err)
	}
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.offsets[offsetKey{k.identity, claim.TP}]
	if o == nil || o.epoch != claim.Epoch || o.next == nil || *o.next != claim.NextOffset {
		return sinks.ErrFenced
	}
	planned := make([]sinks.Changes, len(lanes))
	for i, l := range lanes {
		ls, ok := l.Sink.(*Sink)
		if !ok || ls.s != s || ls.identity != k.identity {
			return fmt.Errorf("commit lanes of %s/%d: lane %d is not a sink of this store and identity %q", claim.Topic, claim.Partition, i, k.identity)
		}
		ch, err := l.Plan(s.load(ls.identity, ls.name, ls.table, claim.TP, l.Keys.All, l.Keys.Parked))
		if err != nil {
			return err
		}
		planned[i] = ch
	}
	for i, l := range lanes {
		l.Sink.(*Sink).apply(claim, planned[i])
	}
	next := end
	o.next = &next
	return nil
}

// apply writes a lane's planned changes (under s.mu).
func (k *Sink) apply(claim sinks.Claim, ch sinks.Changes) {
	s := k.s
	t := s.table(k.table)
	for _, u := range ch.Upserts {
		if cur, has := t.rows[u.Key]; !has || cur.v < u.Version {
			t.rows[u.Key] = version{v: u.Version, row: maps.Clone(u.Row)}
		}
	}
	for _, d := range ch.Deletes {
		// A record tombstone deletes the row at the version it holds.
		if cur, has := t.rows[d.Key]; has && cur.v <= d.Version {
			delete(t.rows, d.Key)
		}
		t.tombs[d.Key] = max(t.tombs[d.Key], d.Version)
	}
	pk := partKey{k.identity, k.name, claim.TP}
	if len(ch.Park) > 0 && s.parked[pk] == nil {
		s.parked[pk] = map[parkedKey]parkedEvent{}
	}
	now := s.now()
	for _, ev := range ch.Park {
		key := parkedKey{ev.Key, ev.Version}
		if _, dup := s.parked[pk][key]; !dup {
			s.parked[pk][key] = parkedEvent{ev: ev, at: now}
		}
	}
	for _, u := range ch.Unpark {
		delete(s.parked[pk], parkedKey{u.Key, u.Version})
	}
	s.dead = append(s.dead, ch.DeadLetters...)
}

// Parked implements sinks.Sink.
func (k *Sink) Parked(ctx context.Context, tp sinks.TP) (map[string]sinks.ParkedInfo, error) {
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	out := map[string]sinks.ParkedInfo{}
	for pk, p := range k.s.parked[partKey{k.identity, k.name, tp}] {
		info := out[pk.key]
		if info.Count == 0 || p.at.Before(info.Since) {
			info.Since = p.at
		}
		info.Count++
		out[pk.key] = info
	}
	return out, nil
}

// Load implements sinks.Sink.
func (k *Sink) Load(ctx context.Context, tp sinks.TP, keys []string) (sinks.State, error) {
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	return k.s.load(k.identity, k.name, k.table, tp, keys, keys), nil
}

// Peek implements sinks.Peeker.
func (k *Sink) Peek(ctx context.Context, claim sinks.Claim, keys sinks.Keys) (sinks.State, error) {
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	return k.s.load(k.identity, k.name, k.table, claim.TP, keys.All, keys.Parked), nil
}

// offsets is the offset store of one identity.
type offsets struct {
	s        *Store
	identity string
}

func (o *offsets) Claim(ctx context.Context, tps []sinks.TP) ([]sinks.Claimed, error) {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	at := o.s.now()
	out := make([]sinks.Claimed, 0, len(tps))
	for _, tp := range tps {
		st := o.s.offsets[offsetKey{o.identity, tp}]
		if st == nil {
			st = &stored{}
			o.s.offsets[offsetKey{o.identity, tp}] = st
		}
		st.epoch++
		c := sinks.Claimed{TP: tp, Epoch: st.epoch, At: at}
		if st.next != nil {
			next := *st.next
			c.NextOffset = &next
		}
		out = append(out, c)
	}
	return out, nil
}

func (o *offsets) InitAll(ctx context.Context, claims []sinks.Claimed, firsts []int64) ([]sinks.TP, error) {
	if len(claims) != len(firsts) {
		return nil, fmt.Errorf("store first offsets: %d claims, %d offsets", len(claims), len(firsts))
	}
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	var out []sinks.TP
	for i, c := range claims {
		st := o.s.offsets[offsetKey{o.identity, c.TP}]
		if st == nil || st.epoch != c.Epoch || st.next != nil {
			continue
		}
		next := firsts[i]
		st.next = &next
		out = append(out, c.TP)
	}
	return out, nil
}

// Owners implements sinks.Offsets.
func (o *offsets) Owners(ctx context.Context, tps []sinks.TP) ([]sinks.Claimed, error) {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	var out []sinks.Claimed
	for _, tp := range tps {
		st := o.s.offsets[offsetKey{o.identity, tp}]
		if st == nil {
			continue
		}
		c := sinks.Claimed{TP: tp, Epoch: st.epoch}
		if st.next != nil {
			next := *st.next
			c.NextOffset = &next
		}
		out = append(out, c)
	}
	return out, nil
}

// Adopt implements sinks.Offsets. The store has no operator reset, so
// there is never one to adopt.
func (o *offsets) Adopt(ctx context.Context, tp sinks.TP, mine int64) (sinks.Claimed, bool, error) {
	return sinks.Claimed{}, false, nil
}
