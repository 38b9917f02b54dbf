package postgres

import (
	"encoding/binary"
	"math"
	"sync"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
)

// DefaultStateCacheRows is how many aggregates' rows a sink keeps in memory
// unless told otherwise (see Sink.SetStateCache).
const DefaultStateCacheRows = 100_000

// stateCache keeps the state of the aggregates a sink has read or written,
// per partition, so that a batch reads from Postgres only the aggregates it
// has not seen. It is right because the sink is the only writer of its
// partitions' aggregates while it holds their claim: an entry is only
// stored after its transaction committed, a partition's entries are
// dropped when its claim epoch changes and after any failed transaction,
// and a batch whose cached state Postgres contradicts is rolled back and
// retried from Postgres.
type stateCache struct {
	max  int // rows across partitions; 0 disables the cache
	cols []projection.Column
	// noRows: only versions and whether rows exist are kept, for a
	// projection whose fold does not read rows (see Sink.readsRows).
	noRows bool

	mu    sync.Mutex
	size  int
	parts map[partition.TP]*partCache
}

type partCache struct {
	epoch int64
	rows  map[string]cachedAgg

	// The cache only pays when batches find their aggregates in it. With
	// far more aggregates than it holds (and no hot ones), nearly every
	// lookup misses and keeping it costs more than it saves, so a
	// partition whose hit rate over a window of lookups stays below
	// minHitRate skips the cache for bypassLookups, then tries again.
	looked, hit int // lookups and hits in the current window
	bypass      int // lookups left to skip
}

const (
	hitWindow     = 20_000
	minHitRate    = 0.3
	bypassLookups = 200_000
)

// cachedAgg is one aggregate as Postgres holds it: its last applied
// version (0: never seen), its row encoded by encodeRow ("": none, or
// deleted; rowExists when the cache keeps no rows) and the row's ctid when
// the sink knows it.
type cachedAgg struct {
	version int64
	row     string
	tid     pgtype.TID
}

// rowExists marks a row that exists in a cache that keeps no rows (an
// encoded row is never empty either: every column takes a tag).
const rowExists = "+"

func newStateCache(max int, cols []projection.Column, rows bool) *stateCache {
	return &stateCache{max: max, cols: cols, noRows: !rows, parts: map[partition.TP]*partCache{}}
}

// encode returns row in cached form; ok is false when it cannot be cached.
func (c *stateCache) encode(row projection.Row) (string, bool) {
	if c.noRows {
		return rowExists, true
	}
	return encodeRow(c.cols, row)
}

// lookup fills st with the cached aggregates among keys (and tids with
// their rows' ctids where known) and returns the keys it does not hold;
// caching reports whether the cache is in use for the partition (see
// tally).
func (c *stateCache) lookup(claim partition.Claim, keys []string, st partition.State, tids map[string]pgtype.TID) (misses []string, hits int, caching bool) {
	if c.max <= 0 {
		return keys, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.part(claim)
	if pc.bypass > 0 {
		pc.bypass -= len(keys)
		return keys, 0, false
	}
	for _, k := range keys {
		a, ok := pc.rows[k]
		if !ok {
			misses = append(misses, k)
			continue
		}
		hits++
		if a.version > 0 {
			st.Versions[k] = a.version
		}
		if a.row != "" && a.tid.Valid {
			tids[k] = a.tid
		}
		switch {
		case a.row == "":
		case c.noRows:
			st.Rows[k] = presentRow
		default:
			st.Rows[k] = decodeRow(c.cols, a.row)
		}
	}
	return misses, hits, true
}

// tally counts a batch's lookups towards the partition's hit rate:
// wanted is how many of its keys would have been read from Postgres had
// they missed (aggregates the batch plans as new cost nothing to miss), hits
// how many of those the cache held. It reports whether the batch's outcome
// is to be stored: not when the hit rate has fallen too low and the
// partition's entries were just dropped.
func (c *stateCache) tally(claim partition.Claim, wanted, hits int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.part(claim)
	if pc.bypass > 0 {
		return false
	}
	pc.looked += wanted
	pc.hit += hits
	if pc.looked < hitWindow {
		return true
	}
	defer func() { pc.looked, pc.hit = 0, 0 }()
	if float64(pc.hit) < minHitRate*float64(pc.looked) {
		c.size -= len(pc.rows)
		pc.rows = map[string]cachedAgg{}
		pc.bypass = bypassLookups
		return false
	}
	return true
}

// part returns the partition's entries under claim, dropping those of an
// earlier claim. Call with mu held.
func (c *stateCache) part(claim partition.Claim) *partCache {
	pc := c.parts[claim.TP]
	if pc == nil || pc.epoch != claim.Epoch {
		if pc != nil {
			c.size -= len(pc.rows)
		}
		pc = &partCache{epoch: claim.Epoch, rows: map[string]cachedAgg{}}
		c.parts[claim.TP] = pc
	}
	return pc
}

// store records what a committed transaction read (the state of the
// missed keys, in loaded) and wrote (rows, already in stored form, and
// deletes), with the rows' ctids as tids has them after the transaction.
func (c *stateCache) store(claim partition.Claim, misses []string, loaded partition.State, rows []partition.RowWrite, deletes []partition.RowDelete, tids map[string]pgtype.TID) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.part(claim)
	if pc.bypass > 0 {
		return // dropped while this batch ran: nothing to keep up to date
	}
	// Large maps make every access a likely CPU cache miss: each key is
	// looked up once and assigned once.
	forget := func(k string) {
		delete(pc.rows, k)
		c.size--
	}
	for _, k := range misses {
		a := cachedAgg{version: loaded.Versions[k], tid: tids[k]}
		if row := loaded.Rows[k]; row != nil {
			var ok bool
			if a.row, ok = c.encode(row); !ok {
				continue // not cached: a miss again next time
			}
		}
		n := len(pc.rows)
		pc.rows[k] = a
		c.size += len(pc.rows) - n
	}
	// A write moves a known aggregate forward. One that Postgres would
	// not have applied as given (an upsert at or below the known version,
	// a delete below it), or of an aggregate whose state was not read,
	// leaves nothing in the cache: its next batch reads Postgres.
	for _, w := range rows {
		cur, ok := pc.rows[w.Key]
		if !ok {
			continue
		}
		if w.Version <= cur.version {
			forget(w.Key)
			continue
		}
		enc, ok := c.encode(w.Row)
		if !ok {
			forget(w.Key)
			continue
		}
		pc.rows[w.Key] = cachedAgg{version: w.Version, row: enc, tid: tids[w.Key]}
	}
	for _, d := range deletes {
		if cur, ok := pc.rows[d.Key]; ok {
			if d.Version >= cur.version {
				pc.rows[d.Key] = cachedAgg{version: d.Version}
			} else {
				forget(d.Key)
			}
		}
	}
	if c.size > c.max {
		c.evict()
	}
}

// evict drops arbitrary entries (Go's map order) of every partition until
// the cache holds at most seven eighths of its maximum, so that eviction
// runs once per many batches rather than on every one.
func (c *stateCache) evict() {
	target := c.max - c.max/8
	for _, pc := range c.parts {
		quota := (c.size - target) * len(pc.rows) / max(c.size, 1)
		for k := range pc.rows {
			if quota <= 0 {
				break
			}
			delete(pc.rows, k)
			c.size--
			quota--
		}
	}
	for _, pc := range c.parts { // rounding may leave a few
		for k := range pc.rows {
			if c.size <= target {
				return
			}
			delete(pc.rows, k)
			c.size--
		}
	}
}

// drop forgets a partition, after a failed transaction or when it is
// revoked.
func (c *stateCache) drop(tp partition.TP) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc := c.parts[tp]; pc != nil {
		c.size -= len(pc.rows)
		delete(c.parts, tp)
	}
}

// A cached row is kept as bytes rather than as a Row: a hundred thousand
// maps of boxed values are pointers the garbage collector follows on every
// cycle (it cost the consumer more CPU than the cache saved it), bytes are
// not. Per column, in the projection's order: a tag, then the value.
const (
	tagNil byte = iota
	tagInt
	tagFloat
	tagFalse
	tagTrue
	tagString
)

// encodeRow encodes row's columns; ok is false for a value of a type a row
// read from Postgres does not hold (see projection.Column.Stored).
func encodeRow(cols []projection.Column, row projection.Row) (enc string, ok bool) {
	var buf [256]byte
	b := buf[:0]
	for _, c := range cols {
		switch v := row[c.Name].(type) {
		case nil:
			b = append(b, tagNil)
		case bool:
			if v {
				b = append(b, tagTrue)
			} else {
				b = append(b, tagFalse)
			}
		case int64:
			b = binary.AppendVarint(append(b, tagInt), v)
		case float64:
			b = binary.LittleEndian.AppendUint64(append(b, tagFloat), math.Float64bits(v))
		case string:
			b = binary.AppendUvarint(append(b, tagString), uint64(len(v)))
			b = append(b, v...)
		default:
			return "", false
		}
	}
	return string(b), true
}

// decodeRow returns the row encodeRow encoded in s, a new map each time
// (folds may keep it). Its strings share s's memory.
func decodeRow(cols []projection.Column, s string) projection.Row {
	row := make(projection.Row, len(cols))
	for _, c := range cols {
		tag := s[0]
		s = s[1:]
		switch tag {
		case tagNil:
			row[c.Name] = nil
		case tagFalse:
			row[c.Name] = false
		case tagTrue:
			row[c.Name] = true
		case tagInt:
			u, n := uvarint(s)
			row[c.Name] = int64(u>>1) ^ -int64(u&1) // zig-zag, as binary.AppendVarint
			s = s[n:]
		case tagFloat:
			row[c.Name] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[:8])))
			s = s[8:]
		case tagString:
			l, n := uvarint(s)
			row[c.Name] = s[n : n+int(l)]
			s = s[n+int(l):]
		}
	}
	return row
}

// uvarint is binary.Uvarint for the bytes of a string encodeRow wrote.
func uvarint(s string) (uint64, int) {
	var x uint64
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b < 0x80 {
			return x | uint64(b)<<(7*i), i + 1
		}
		x |= uint64(b&0x7f) << (7 * i)
	}
	return x, len(s)
}
