// Package demo is the demo domain: bank accounts. It generates a realistic
// event stream (duplicates, out-of-order and gapped versions, poison
// pills), folds it by hand as the reference the engine is checked against,
// and compares a projection table with that reference.
package demo

import (
	_ "embed"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Topic is the demo's topic; Table the account projection's table.
const (
	Topic = "accounts.events"
	Table = "accounts"
)

// Projections is the demo's projection file.
//
//go:embed projections.yaml
var Projections []byte

// Event is one account event as the source service emits it.
type Event struct {
	AccountID  string
	Version    int64
	Type       string // AccountOpened, Deposited, Withdrawn, AccountClosed
	Owner      string
	Amount     int64
	OccurredAt time.Time
	// V2 selects the newer writer schema (with a currency field).
	V2 bool
}

// Record is one record of the generated stream: an event, a poison pill
// (Poison non-empty, raw value in Raw), or a tombstone.
type Record struct {
	Key    string // the record key; "" sends none
	Event  Event
	Poison string // why the value is bad; "" for a good event
	Raw    []byte // the bad value of a poison pill
	// Tombstone sends a null value, which deletes the row of the account
	// Key names; Event is not sent.
	Tombstone bool
}

// Options shape the generated stream.
type Options struct {
	Aggregates int
	// MeanEvents is the mean number of versions per aggregate.
	MeanEvents int
	// Duplicate, Reorder are per-event probabilities of re-sending an
	// earlier event and of swapping two neighbouring versions.
	Duplicate, Reorder float64
	// GapEvery makes every n-th aggregate lose one version for good (0:
	// never): its later events stay parked.
	GapEvery int
	// Poison is the number of poison pills mixed in.
	Poison int
	// CloseEvery closes (deletes) every n-th account at its end (0: never).
	CloseEvery int
	// TombstoneEvery sends a tombstone for every n-th account (0: never),
	// after one of its records: the versions after it build a new row. A
	// copy of one of the versions sent before it follows it, later, and
	// must be stale. As many tombstones again are sent for accounts that
	// never existed, and a few without a key.
	TombstoneEvery int
	Seed           uint64
}

// DefaultOptions is the demo's stream: 220,000 events over 20,000 accounts.
func DefaultOptions() Options {
	return Options{Aggregates: 20_000, MeanEvents: 10, Duplicate: 0.03, Reorder: 0.03, GapEvery: 200, Poison: 25, CloseEvery: 20, Seed: 1}
}

// Generate returns the stream in the order it is produced.
func Generate(o Options) []Record {
	records, _ := GenerateWithDropped(o)
	return records
}

// GenerateWithDropped also returns the events left out of the stream to
// make gaps (what a repair source would know).
func GenerateWithDropped(o Options) ([]Record, []Event) {
	var dropped []Event
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type agg struct {
		events []Event
		next   int
	}
	aggs := make([]*agg, o.Aggregates)
	total := 0
	for i := range aggs {
		id := fmt.Sprintf("acc-%06d", i)
		n := 1 + rng.IntN(2*o.MeanEvents-1)
		a := &agg{}
		for v := 1; v <= n; v++ {
			ev := Event{AccountID: id, Version: int64(v), OccurredAt: base.Add(time.Duration(total) * time.Millisecond), V2: rng.IntN(2) == 0}
			switch {
			case v == 1:
				ev.Type, ev.Owner = "AccountOpened", fmt.Sprintf("owner %d", i)
			case v == n && o.CloseEvery > 0 && i%o.CloseEvery == 0 && n > 1:
				ev.Type = "AccountClosed"
			case rng.IntN(3) == 0:
				ev.Type, ev.Amount = "Withdrawn", int64(1+rng.IntN(500))
			default:
				ev.Type, ev.Amount = "Deposited", int64(1+rng.IntN(1000))
			}
			a.events = append(a.events, ev)
			total++
		}
		if o.GapEvery > 0 && i%o.GapEvery == o.GapEvery-1 && n > 2 {
			drop := 1 + rng.IntN(n-2) // never v1, never the last
			dropped = append(dropped, a.events[drop])
			a.events = append(a.events[:drop], a.events[drop+1:]...)
		}
		for j := 0; j+1 < len(a.events); j++ {
			if rng.Float64() < o.Reorder {
				a.events[j], a.events[j+1] = a.events[j+1], a.events[j]
				j++
			}
		}
		aggs[i] = a
	}

	out := make([]Record, 0, total+total/10+o.Poison)
	live := make([]int, len(aggs))
	for i := range live {
		live[i] = i
	}
	for len(live) > 0 {
		k := rng.IntN(len(live))
		a := aggs[live[k]]
		ev := a.events[a.next]
		out = append(out, Record{Key: ev.AccountID, Event: ev})
		if a.next > 0 && rng.Float64() < o.Duplicate {
			dup := a.events[rng.IntN(a.next)]
			out = append(out, Record{Key: dup.AccountID, Event: dup})
		}
		a.next++
		if a.next == len(a.events) {
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	for i := 0; i < o.Poison; i++ {
		pos := rng.IntN(len(out) + 1)
		key := fmt.Sprintf("acc-%06d", rng.IntN(o.Aggregates))
		var r Record
		switch i % 3 {
		case 0:
			r = Record{Key: key, Poison: "garbage bytes", Raw: []byte("not avro at all")}
		case 1:
			r = Record{Key: key, Poison: "wrong magic byte", Raw: []byte{7, 0, 0, 0, 1, 2, 4, 6}}
		default:
			r = Record{Key: key, Poison: "unknown schema id", Raw: []byte{0, 0, 0, 0x7f, 0x7f, 2, 4}}
		}
		out = append(out, Record{})
		copy(out[pos+1:], out[pos:])
		out[pos] = r
	}
	if o.TombstoneEvery > 0 {
		out = addTombstones(out, o)
	}
	return out, dropped
}

// addTombstones mixes tombstones into the stream (see
// Options.TombstoneEvery), with a random source of their own so that the
// rest of the stream is the one Generate makes without them.
func addTombstones(out []Record, o Options) []Record {
	rng := rand.New(rand.NewPCG(o.Seed^0x5851f42d4c957f2d, o.Seed))
	at := map[string][]int{} // each account's records, by position
	for i, r := range out {
		if r.Poison == "" {
			at[r.Key] = append(at[r.Key], i)
		}
	}
	type insert struct {
		after int // the position the record follows
		r     Record
	}
	var adds []insert
	for i := 0; i < o.Aggregates; i += o.TombstoneEvery {
		id := fmt.Sprintf("acc-%06d", i)
		pos := at[id]
		if len(pos) == 0 {
			continue
		}
		k := rng.IntN(len(pos))
		adds = append(adds, insert{pos[k], Record{Key: id, Tombstone: true}})
		late := out[pos[rng.IntN(k+1)]]
		adds = append(adds, insert{pos[k] + rng.IntN(len(out)-pos[k]), late})
		never := fmt.Sprintf("never-%06d", i)
		adds = append(adds, insert{rng.IntN(len(out)), Record{Key: never, Tombstone: true}})
		if i%(10*o.TombstoneEvery) == 0 {
			adds = append(adds, insert{rng.IntN(len(out)), Record{Tombstone: true}})
		}
	}
	// Stable: a late copy at the tombstone's position stays after it.
	slices.SortStableFunc(adds, func(a, b insert) int { return a.after - b.after })
	with := make([]Record, 0, len(out)+len(adds))
	for i, r := range out {
		with = append(with, r)
		for len(adds) > 0 && adds[0].after == i {
			with = append(with, adds[0].r)
			adds = adds[1:]
		}
	}
	return with
}
