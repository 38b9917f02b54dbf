package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/sinks"
)

// DefaultTombstoneFilterKeys is the most tombstones of a table a sink
// reads into its tombstone filter (see SetTombstoneFilter).
const DefaultTombstoneFilterKeys = 1_000_000

// tombstoneFalsePositives is the share of keys without a tombstone that
// the filter cannot rule out (they are probed as before).
const tombstoneFalsePositives = 0.01

// tombstoneFilter rules out tombstones, so that the rows of aggregates
// assumed new (see sinks.Keys.New) are inserted without probing
// projector_tombstones for each one, a large part of what inserting such
// a row cost Postgres.
//
// A partition's filter holds every tombstone of the table Postgres held
// after the partition was claimed, and those the partition wrote since:
// only the partition's owner writes its aggregates' tombstones, so
// nothing else can add one of its keys while the claim lasts. The table's
// tombstones are read once for all partitions claimed before the read
// began (a member claims its partitions together) into a filter they
// share; each partition adds its own deletes, before they commit, to a set
// of its own, and past ownDeletes of them to a copy of the shared filter.
// A table with more tombstones than the filter may hold is probed as
// before.
type tombstoneFilter struct {
	table string
	max   int // most tombstones read; 0: no filter, every insert probes

	mu    sync.Mutex // held while the table's tombstones are read
	read  *bloom.BloomFilter
	since time.Time // when that read began
	over  bool      // the table held more than max
	parts map[sinks.TP]*partTombstones
}

// ownDeletes is how many of its own deletes a partition keeps beside the
// shared filter before it adds them to a copy of it.
const ownDeletes = 10_000

// partTombstones is one partition's filter under one claim: the shared
// filter (nil: not read yet, or not usable: over) and the partition's own
// deletes, or a copy of the shared filter with them added (own).
type partTombstones struct {
	epoch   int64
	since   time.Time // when the claim began
	shared  *bloom.BloomFilter
	own     *bloom.BloomFilter
	deletes map[string]struct{}
	over    bool
}

// has reports whether key may have a tombstone. Call with mu held, once
// the partition has its filter.
func (p *partTombstones) has(key string) bool {
	if p.own != nil {
		return p.own.TestString(key)
	}
	_, deleted := p.deletes[key]
	return deleted || p.shared.TestString(key)
}

// add records one of the partition's deletes. Call with mu held.
func (p *partTombstones) add(key string) {
	switch {
	case p.own != nil:
		p.own.AddString(key)
		return
	case p.deletes == nil:
		p.deletes = map[string]struct{}{}
	}
	p.deletes[key] = struct{}{}
	p.spill()
}

// spill moves the partition's deletes into a copy of the shared filter
// once they are more than ownDeletes. Call with mu held.
func (p *partTombstones) spill() {
	if p.shared == nil || len(p.deletes) <= ownDeletes {
		return
	}
	p.own = p.shared.Copy()
	for k := range p.deletes {
		p.own.AddString(k)
	}
	p.deletes = nil
}

func newTombstoneFilter(table string, max int) *tombstoneFilter {
	return &tombstoneFilter{table: table, max: max, parts: map[sinks.TP]*partTombstones{}}
}

// part returns the partition's filter under claim. Call with mu held.
func (f *tombstoneFilter) part(claim sinks.Claim) *partTombstones {
	p := f.parts[claim.TP]
	if p == nil || p.epoch != claim.Epoch {
		since := claim.Since
		if since.IsZero() {
			since = time.Now() // claimed no later than this
		}
		p = &partTombstones{epoch: claim.Epoch, since: since}
		f.parts[claim.TP] = p
	}
	return p
}

// rule removes from assumed the aggregates that surely have no
// tombstone; the others keep being probed. It reads the table's
// tombstones (through q) when no read since the partition's claim has.
func (f *tombstoneFilter) rule(ctx context.Context, q pgx.Tx, claim sinks.Claim, assumed map[string]bool) error {
	if f.max <= 0 || len(assumed) == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.part(claim)
	if p.shared == nil && !p.over {
		if f.since.IsZero() || !f.since.After(p.since) {
			if err := f.load(ctx, q); err != nil {
				return err
			}
		}
		if f.over {
			p.over, p.deletes = true, nil
			return nil
		}
		p.shared = f.read // never written to: a later read makes another
		p.spill()
	}
	if p.over {
		return nil
	}
	for k := range assumed {
		if !p.has(k) {
			delete(assumed, k)
		}
	}
	return nil
}

// load reads the table's tombstones. Call with mu held.
func (f *tombstoneFilter) load(ctx context.Context, q pgx.Tx) error {
	began := time.Now()
	rows, err := q.Query(ctx, `SELECT key FROM projector_tombstones WHERE table_name = $1 LIMIT $2`, f.table, f.max+1)
	if err != nil {
		return fmt.Errorf("read tombstones of %s: %w", f.table, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read tombstones of %s: %w", f.table, err)
	}
	f.since, f.over, f.read = began, len(keys) > f.max, nil
	if f.over {
		return nil
	}
	// Room for as many more deletes as the table holds, or 100,000.
	f.read = bloom.NewWithEstimates(uint(max(2*len(keys), 100_000)), tombstoneFalsePositives)
	for _, k := range keys {
		f.read.AddString(k)
	}
	return nil
}

// deleted adds the keys of a transaction's deletes to the partition's
// filter, before the transaction may commit. The partition's earlier
// transactions have all ended (it commits one at a time): a partition
// without a filter yet that has noted ownDeletes deletes forgets those of
// the earlier ones and asks for a read of the table that begins after
// them instead.
func (f *tombstoneFilter) deleted(claim sinks.Claim, deletes []sinks.RowDelete) {
	if f.max <= 0 || len(deletes) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.part(claim)
	if p.over {
		return
	}
	if p.shared == nil && len(p.deletes)+len(deletes) > ownDeletes {
		p.deletes, p.since = nil, time.Now()
	}
	for _, d := range deletes {
		p.add(d.Key)
	}
}

// forget drops a partition's filter, when it is revoked.
func (f *tombstoneFilter) forget(tp sinks.TP) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.parts, tp)
}
