package postgres

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"sync"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// The most a sink's state cache holds unless told otherwise (see
// Sink.SetStateCache): whichever bound it reaches first. A cached
// aggregate takes its key, its encoded row and entryBytes more; one with a
// few short columns takes 150-160 bytes of live heap (depending on how
// full the maps' tables are) and counts 184, so 128 MiB hold some 730,000
// of them. The process's resident memory grows by up to
// about twice that, as Go's collector lets the heap reach twice what is
// live (GOGC=100).
const (
	DefaultStateCacheRows  = 1_000_000
	DefaultStateCacheBytes = 128 << 20
)

// entryBytes is what the cache counts for one entry besides the bytes of
// its key and row: its map slot (hash and entry, with the load factor's
// slack) and the share of unused bytes that compaction lets accumulate
// (see partCache.compact) and the unused ends of data's chunks (see
// arena), as measured on rows of four short columns over 12
// partitions: 100,000 to 740,000 such entries took 154-159 bytes of heap
// each, 184 counted.
const entryBytes = 110

// What the cache counts for a partition besides its entries: partBytes
// for each partition it knows (its bookkeeping), holdBytes more while the
// partition holds entries (its map's first group and its data's first
// chunk, see arena, which a partition holding a few entries takes whole).
// A member owning thousands of partitions spends that on each of them,
// and the bound must say so.
const (
	partBytes = 192
	holdBytes = 320
)

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
	hash   func(key string) uint64

	mu      sync.Mutex
	size    int   // entries
	bytes   int64 // their cost
	holding int   // partitions with entries
	parts   map[sinks.TP]*partCache
}

// partCache holds one partition's entries. Nothing in it is a pointer
// the garbage collector follows per entry: a million cached aggregates
// held as strings in a map were millions of pointers to trace on every
// cycle, and every lookup compared a key stored elsewhere in memory.
// Entries are keyed by their key's hash and find their key and row in
// data; a lookup whose key differs from the entry's (a collision of 64-bit
// hashes) misses, and storing it replaces the other aggregate's entry.
type partCache struct {
	epoch int64
	ents  map[uint64]cachedAgg // nil until the first entry, and once none is left
	// data holds the keys and rows of ents. A row is rewritten in place
	// when the new one fits, appended otherwise; data is compacted once
	// the bytes no entry uses take a quarter of it. Lookups copy rows out.
	data  arena
	live  int // bytes of data that entries hold (keys and row slots)
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
// version (0: never seen), its key and its row encoded by appendRow (none,
// or deleted: rlen 0; rowExists when the cache keeps no rows) as offsets
// into its partCache's data.
// The row's slot is rcap bytes long (rows of up to 64 KiB; a longer one's
// slot is its length, and the slot is never reused).
type cachedAgg struct {
	version    int64
	koff, roff uint32
	rlen       uint32
	klen, rcap uint16
}

// slot is the bytes of data a's row slot takes.
func (a cachedAgg) slot() int {
	if a.rlen > math.MaxUint16 {
		return int(a.rlen)
	}
	return int(a.rcap)
}

// rowExists marks a row that exists in a cache that keeps no rows (an
// encoded row is never empty either: every column takes a tag).
const rowExists = "+"

// maxData is the most data a partition's entries may take; entries beyond
// it are not kept (offsets are 32 bits).
const maxData = math.MaxUint32 / 2

func newStateCache(max int, maxBytes int64, cols []projection.Column, rows bool) *stateCache {
	if maxBytes <= 0 {
		max = 0
	}
	seed := maphash.MakeSeed()
	hash := func(key string) uint64 { return maphash.String(seed, key) }
	return &stateCache{max: max, maxBytes: maxBytes, cols: cols, noRows: !rows, hash: hash, parts: map[sinks.TP]*partCache{}}
}

// cost is what an entry counts towards the byte bound.
func cost(a cachedAgg) int64 { return int64(a.klen) + int64(a.slot()) + entryBytes }

// get returns key's entry.
func (c *stateCache) get(pc *partCache, key string) (h uint64, a cachedAgg, ok bool) {
	h = c.hash(key)
	a, ok = pc.ents[h]
	if ok && !pc.holds(a, key) {
		return h, cachedAgg{}, false // another key's entry
	}
	return h, a, ok
}

// holds reports whether a is key's entry.
func (pc *partCache) holds(a cachedAgg, key string) bool {
	return string(pc.data.at(a.koff, int(a.klen))) == key
}

// row is a copy of a's row as appendRow encoded it ("": none).
func (pc *partCache) row(a cachedAgg) string { return string(pc.data.at(a.roff, int(a.rlen))) }

// put stores an entry for key at hash h with version and row,
// replacing old, the entry at h when had: key's own when own, another
// key's after a collision of hashes. An entry whose key or partition's
// data would be too long is not kept: h is left without one. Call with mu
// held.
func (c *stateCache) put(pc *partCache, h uint64, key string, old cachedAgg, had, own bool, version int64, row []byte) {
	if len(key) > math.MaxUint16 || pc.data.len()+len(key)+len(row)+2*chunkSize > maxData {
		if had {
			c.remove(pc, h, old)
		}
		return
	}
	if had {
		c.size--
		pc.live -= int(old.klen) + old.slot()
		pc.bytes -= cost(old)
		c.bytes -= cost(old)
	}
	a := cachedAgg{version: version, klen: uint16(len(key)), rlen: uint32(len(row))}
	if own && old.rlen <= math.MaxUint16 && len(row) <= old.slot() {
		a.koff, a.roff, a.rcap = old.koff, old.roff, old.rcap // in place
		copy(pc.data.at(a.roff, len(row)), row)
	} else {
		if own {
			a.koff = old.koff // the key's bytes stay
		} else {
			a.koff = add(&pc.data, key)
		}
		a.roff = add(&pc.data, row)
		a.rcap = uint16(min(len(row), math.MaxUint16))
	}
	if len(pc.ents) == 0 {
		if pc.ents == nil {
			pc.ents = map[uint64]cachedAgg{}
		}
		c.holding++
	}
	pc.ents[h] = a
	c.size++
	pc.live += int(a.klen) + a.slot()
	pc.bytes += cost(a)
	c.bytes += cost(a)
}

// remove drops a, the entry at hash h. Call with mu held.
func (c *stateCache) remove(pc *partCache, h uint64, a cachedAgg) {
	delete(pc.ents, h)
	if len(pc.ents) == 0 {
		c.holding--
	}
	c.size--
	pc.live -= int(a.klen) + a.slot()
	pc.bytes -= cost(a)
	c.bytes -= cost(a)
}

// compactMin is the fewest unused bytes worth compacting a partition's
// data for: little, so that a partition holding a few entries does not
// keep many times their bytes after evictions.
var compactMin = 256

// compact rewrites data with only the bytes entries hold once the others
// take a quarter of it, into a map of its own size (a Go map never
// shrinks), and lets a partition left without entries go of both.
// Call with mu held.
func (pc *partCache) compact() {
	if len(pc.ents) == 0 {
		pc.ents, pc.data, pc.live = nil, arena{}, 0
		return
	}
	if dead := pc.data.len() - pc.live; dead < compactMin || dead < pc.data.len()/4 {
		return
	}
	var data arena
	ents := make(map[uint64]cachedAgg, len(pc.ents))
	for h, a := range pc.ents {
		a.koff = add(&data, pc.data.at(a.koff, int(a.klen)))
		a.roff = add(&data, pc.data.at(a.roff, a.slot()))
		ents[h] = a
	}
	pc.ents, pc.data = ents, data
}

// clear removes all of a partition's entries. Call with mu held.
func (c *stateCache) clear(pc *partCache) {
	if len(pc.ents) > 0 {
		c.holding--
	}
	c.size -= len(pc.ents)
	c.bytes -= pc.bytes
	pc.ents, pc.data, pc.live, pc.bytes = nil, arena{}, 0, 0
}

// encode appends row in cached form to b; ok is false when it cannot be
// cached.
func (c *stateCache) encode(b []byte, row projection.Row) ([]byte, bool) {
	if c.noRows {
		return append(b, rowExists...), true
	}
	return appendRow(b, c.cols, row)
}

// lookup fills st with the cached aggregates among keys and returns the
// keys it does not hold; caching reports whether the cache is in use for
// the partition (see tally). Without rows, an existing row is given as
// presentRow.
func (c *stateCache) lookup(claim sinks.Claim, keys []string, st sinks.State, rows bool) (misses []string, hits int, caching bool) {
	return c.lookupUnheld(claim, keys, nil, st, rows)
}

// lookupUnheld is lookup for a caller that knows the cache holds none of
// unheld, some of keys in their order: those are given as misses without
// a lookup (one out of order is looked up).
func (c *stateCache) lookupUnheld(claim sinks.Claim, keys, unheld []string, st sinks.State, rows bool) (misses []string, hits int, caching bool) {
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
	n := 0 // unheld[:n] are passed
	for _, k := range keys {
		if n < len(unheld) && unheld[n] == k {
			n++
			misses = append(misses, k)
			continue
		}
		_, a, ok := c.get(pc, k)
		if !ok {
			misses = append(misses, k)
			continue
		}
		hits++
		if a.version > 0 {
			st.Versions[k] = a.version
		}
		switch {
		case a.rlen == 0:
		case c.noRows || !rows:
			st.Rows[k] = presentRow
		default:
			st.Rows[k] = decodeRow(c.cols, pc.row(a))
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
func (c *stateCache) tally(claim sinks.Claim, wanted, hits int) bool {
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
func (c *stateCache) part(claim sinks.Claim) *partCache {
	pc := c.parts[claim.TP]
	if pc == nil || pc.epoch != claim.Epoch {
		if pc != nil {
			c.clear(pc)
		}
		pc = &partCache{epoch: claim.Epoch}
		c.parts[claim.TP] = pc
	}
	return pc
}

// store records what a committed transaction read (the state of the
// missed keys, in loaded) and wrote (rows, already in stored form, and
// deletes).
func (c *stateCache) store(claim sinks.Claim, misses []string, loaded sinks.State, rows []sinks.RowWrite, deletes []sinks.RowDelete) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.part(claim)
	if pc.bypass > 0 {
		return // dropped while this batch ran: nothing to keep up to date
	}
	// A missed key that was also written gets its written state at once:
	// storing what was read and then the write took a second lookup and
	// a second copy of the row for nearly every aggregate of a stream
	// whose aggregates are mostly new. hashes[i] is rows[i]'s key's hash;
	// stored marks the rows stored with their misses.
	hashes := make([]uint64, len(rows))
	var (
		written map[uint64]int // rows by their key's hash
		stored  []bool
	)
	for i, w := range rows {
		hashes[i] = c.hash(w.Key)
	}
	if len(misses) > 0 && len(rows) > 0 {
		written, stored = make(map[uint64]int, len(rows)), make([]bool, len(rows))
		for i, h := range hashes {
			written[h] = i
		}
	}
	var buf []byte // each row encoded, then copied into the partition's data
	for _, k := range misses {
		h := c.hash(k)
		old, had := pc.ents[h]
		own := had && pc.holds(old, k)
		version, row := loaded.Versions[k], loaded.Rows[k]
		if i, ok := written[h]; ok && rows[i].Key == k {
			stored[i] = true
			w := rows[i]
			if buf, ok = c.encode(buf[:0], w.Row); !ok || w.Version <= version {
				// Not cacheable, or not applied as given (see below).
				if had {
					c.remove(pc, h, old)
				}
				continue
			}
			c.put(pc, h, k, old, had, own, w.Version, buf)
			continue
		}
		buf = buf[:0]
		if row != nil {
			var ok bool
			if buf, ok = c.encode(buf, row); !ok {
				continue // not cached: a miss again next time
			}
		}
		c.put(pc, h, k, old, had, own, version, buf)
	}
	// A write moves a known aggregate forward. One that Postgres would
	// not have applied as given (an upsert at or below the known version,
	// a delete below it), or of an aggregate whose state was not read,
	// leaves nothing in the cache: its next batch reads Postgres.
	for i, w := range rows {
		if stored != nil && stored[i] {
			continue
		}
		h := hashes[i]
		cur, ok := pc.ents[h]
		if !ok || !pc.holds(cur, w.Key) {
			continue
		}
		buf, ok = c.encode(buf[:0], w.Row)
		if w.Version <= cur.version || !ok {
			c.remove(pc, h, cur)
			continue
		}
		c.put(pc, h, w.Key, cur, true, true, w.Version, buf)
	}
	for _, d := range deletes {
		if h, cur, ok := c.get(pc, d.Key); ok {
			if d.Version >= cur.version {
				c.put(pc, h, d.Key, cur, true, true, d.Version, nil)
			} else {
				c.remove(pc, h, cur)
			}
		}
	}
	if c.size > c.max || c.used() > c.maxBytes {
		c.evict()
	}
	pc.compact()
}

// used is what the cache counts against its byte bound: its entries and
// its partitions. Call with mu held.
func (c *stateCache) used() int64 { return c.held() + int64(len(c.parts))*partBytes }

// held is what the entries count and the partitions because they hold
// them: what evicting can free. Call with mu held.
func (c *stateCache) held() int64 { return c.bytes + int64(c.holding)*holdBytes }

// evict drops arbitrary entries (Go's map order) of every partition, in
// proportion to its share, until the cache holds at most seven eighths of
// its maximum rows and bytes, so that eviction runs once per many batches
// rather than on every one.
func (c *stateCache) evict() {
	// What the partitions known take is not evicted: with more partitions
	// than the bound has room for, nothing is kept.
	rows, bytes := c.max-c.max/8, c.maxBytes-c.maxBytes/8-int64(len(c.parts))*partBytes
	over := func() bool { return c.size > rows || c.held() > bytes }
	share := max(float64(c.size-rows)/float64(max(c.size, 1)), float64(c.held()-bytes)/float64(max(c.held(), 1)))
	for _, pc := range c.parts {
		quota := int(share*float64(len(pc.ents))) + 1
		for h, a := range pc.ents {
			if quota <= 0 {
				break
			}
			c.remove(pc, h, a)
			quota--
		}
	}
	for _, pc := range c.parts { // rounding may leave a few
		for h, a := range pc.ents {
			if !over() {
				break
			}
			c.remove(pc, h, a)
		}
		pc.compact()
	}
}

// usage reports how many entries the cache holds and what it counts
// against its byte bound (see used).
func (c *stateCache) usage() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.used()
}

// drop forgets a partition, after a failed transaction or when it is
// revoked.
func (c *stateCache) drop(tp sinks.TP) {
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

// appendRow appends row's columns, encoded, to b; ok is false for a value
// of a type a row read from Postgres does not hold (see
// projection.Column.Stored).
func appendRow(b []byte, cols []projection.Column, row projection.Row) ([]byte, bool) {
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
			return b, false
		}
	}
	return b, true
}

// decodeRow returns the row appendRow encoded in s, a new map each time
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

// uvarint is binary.Uvarint for the bytes of a string appendRow wrote.
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
