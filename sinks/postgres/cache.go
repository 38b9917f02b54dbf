package postgres

import (
	"encoding/binary"
	"math"
	"sync"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
)

// The most a sink's state cache holds unless told otherwise (see
// Sink.SetStateCache): whichever bound it reaches first. A cached
// aggregate takes its key, its encoded row and entryBytes more; one with a
// few short columns takes about 160 bytes of live heap, so 128 MiB hold
// some 800,000 of them. The process's resident memory grows by up to
// about twice that, as Go's collector lets the heap reach twice what is
// live (GOGC=100).
const (
	DefaultStateCacheRows  = 1_000_000
	DefaultStateCacheBytes = 128 << 20
)

// entryBytes is what the cache counts for one entry besides the bytes of
// its key and row: the map slot (key and value headers, control byte, the
// load factor's slack) and the allocation headroom of the two strings, as
// measured on rows of four short columns.
const entryBytes = 112

// stateCache keeps the state of the aggregates a sink has read or written,
// per partition, so that a batch reads from Postgres only the aggregates it
// has not seen. It is right because the sink is the only writer of its
// partitions' aggregates while it holds their claim: an entry is only
// stored after its transaction committed, a partition's entries are
// dropped when its claim epoch changes and after any failed transaction,
// and a batch whose cached state Postgres contradicts is rolled back and
// retried from Postgres.
type stateCache struct {
	max      int   // rows across partitions; 0 disables the cache
	maxBytes int64 // bytes across partitions (see entryBytes)
	cols     []projection.Column
	// noRows: only versions and whether rows exist are kept, for a
	// projection whose fold does not read rows (see Sink.readsRows).
	noRows bool

	mu    sync.Mutex
	size  int   // entries
	bytes int64 // their cost
	parts map[partition.TP]*partCache
}

type partCache struct {
	epoch int64
	rows  map[string]cachedAgg
	bytes int64

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

func newStateCache(max int, maxBytes int64, cols []projection.Column, rows bool) *stateCache {
	if maxBytes <= 0 {
		max = 0
	}
	return &stateCache{max: max, maxBytes: maxBytes, cols: cols, noRows: !rows, parts: map[partition.TP]*partCache{}}
}

// cost is what an entry counts towards the byte bound.
func cost(key string, a cachedAgg) int64 { return int64(len(key) + len(a.row) + entryBytes) }

// set stores a as key's entry, replacing old (had: there was one). Call
// with mu held.
func (c *stateCache) set(pc *partCache, key string, old cachedAgg, had bool, a cachedAgg) {
	pc.rows[key] = a
	d := cost(key, a)
	if had {
		d -= cost(key, old)
	} else {
		c.size++
	}
	pc.bytes += d
	c.bytes += d
}

// forget removes key's entry old. Call with mu held.
func (c *stateCache) forget(pc *partCache, key string, old cachedAgg) {
	delete(pc.rows, key)
	c.size--
	pc.bytes -= cost(key, old)
	c.bytes -= cost(key, old)
}

// recount sums a partition's entries' cost again. Call with mu held.
func (c *stateCache) recount(pc *partCache) {
	c.bytes -= pc.bytes
	pc.bytes = 0
	for k, a := range pc.rows {
		pc.bytes += cost(k, a)
	}
	c.bytes += pc.bytes
}

// clear removes all of a partition's entries. Call with mu held.
func (c *stateCache) clear(pc *partCache) {
	c.size -= len(pc.rows)
	c.bytes -= pc.bytes
	pc.rows, pc.bytes = map[string]cachedAgg{}, 0
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
		c.clear(pc)
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
			c.clear(pc)
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
		if len(pc.rows) > n {
			c.size++
			pc.bytes += cost(k, a)
			c.bytes += cost(k, a)
		} else {
			c.recount(pc) // a miss was cached meanwhile: cannot happen, but stay exact
		}
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
			c.forget(pc, w.Key, cur)
			continue
		}
		enc, ok := c.encode(w.Row)
		if !ok {
			c.forget(pc, w.Key, cur)
			continue
		}
		c.set(pc, w.Key, cur, true, cachedAgg{version: w.Version, row: enc, tid: tids[w.Key]})
	}
	for _, d := range deletes {
		if cur, ok := pc.rows[d.Key]; ok {
			if d.Version >= cur.version {
				c.set(pc, d.Key, cur, true, cachedAgg{version: d.Version})
			} else {
				c.forget(pc, d.Key, cur)
			}
		}
	}
	if c.size > c.max || c.bytes > c.maxBytes {
		c.evict()
	}
}

// evict drops arbitrary entries (Go's map order) of every partition, in
// proportion to its share, until the cache holds at most seven eighths of
// its maximum rows and bytes, so that eviction runs once per many batches
// rather than on every one.
func (c *stateCache) evict() {
	rows, bytes := c.max-c.max/8, c.maxBytes-c.maxBytes/8
	over := func() bool { return c.size > rows || c.bytes > bytes }
	share := max(float64(c.size-rows)/float64(max(c.size, 1)), float64(c.bytes-bytes)/float64(max(c.bytes, 1)))
	for _, pc := range c.parts {
		quota := int(share*float64(len(pc.rows))) + 1
		for k, a := range pc.rows {
			if quota <= 0 {
				break
			}
			c.forget(pc, k, a)
			quota--
		}
	}
	for _, pc := range c.parts { // rounding may leave a few
		for k, a := range pc.rows {
			if !over() {
				return
			}
			c.forget(pc, k, a)
		}
	}
}

// usage reports how many entries the cache holds and what they count
// against its byte bound.
func (c *stateCache) usage() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.bytes
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
		c.clear(pc)
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
