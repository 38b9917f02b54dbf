package postgres

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// cacheHeap fills a cache of maxBytes with perPart aggregates in each of
// parts partitions, as a member owning that many would, and returns the
// heap it takes and the bytes it reports (Sink.CacheStats).
func cacheHeap(t *testing.T, parts, perPart int, maxBytes int64) (heap, reported int64) {
	t.Helper()
	cols := []projection.Column{{Name: "owner", Type: "text"}, {Name: "n", Type: "bigint"}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := newStateCache(DefaultStateCacheRows, maxBytes, cols, true)
	for p := range parts {
		claim := sinks.Claim{TP: sinks.TP{Topic: "accounts.events", Partition: int32(p)}, Epoch: 1}
		keys := make([]string, perPart)
		rows := make([]sinks.RowWrite, perPart)
		for i := range keys {
			keys[i] = fmt.Sprintf("acct-%d-%d", p, i)
			rows[i] = sinks.RowWrite{Key: keys[i], Version: 1, Row: projection.Row{"owner": "owner of " + keys[i], "n": int64(i)}}
		}
		c.store(claim, keys, sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}, rows, nil)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	_, reported = c.usage()
	runtime.KeepAlive(c)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc), reported
}

// A member owning thousands of partitions, each with a few aggregates
// cached, takes no more memory for its cache than the cache reports, and
// that stays within --state-cache-bytes: a partition's share of the cache
// grows with what it holds, not by a large block at its first entry.
func TestStateCacheMemoryOfManyPartitionsIsCounted(t *testing.T) {
	for _, tc := range []struct {
		name           string
		parts, perPart int
		maxBytes       int64
	}{
		{"within the bound", 4000, 3, 16 << 20},
		{"over the bound", 4000, 20, 4 << 20},
		{"tight bound", 4000, 20, 1 << 20},
		{"few large partitions", 12, 20_000, 64 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heap, reported := cacheHeap(t, tc.parts, tc.perPart, tc.maxBytes)
			t.Logf("%d partitions of %d aggregates: %d KiB of heap, %d KiB reported, bound %d KiB",
				tc.parts, tc.perPart, heap>>10, reported>>10, tc.maxBytes>>10)
			if reported > tc.maxBytes {
				t.Errorf("the cache reports %d bytes, over its bound of %d", reported, tc.maxBytes)
			}
			// A little slack for the runtime's own bookkeeping.
			if slack := int64(256 << 10); heap > reported+slack {
				t.Errorf("the cache takes %d KiB of heap but reports %d KiB: %d KiB are counted against no bound",
					heap>>10, reported>>10, (heap-reported)>>10)
			}
		})
	}
}

// An arena takes memory in proportion to what it holds while that fits in
// one chunk, and what it handed out reads back as it grows.
func TestArenaFirstChunkGrowsWithItsValues(t *testing.T) {
	var a arena
	var offs []uint32
	for i := range 8000 {
		offs = append(offs, add(&a, fmt.Sprintf("value-%04d", i)))
		if a.len() <= chunkSize && a.capacity() > max(firstChunk, 2*a.len()) {
			t.Fatalf("%d bytes held in %d of capacity", a.len(), a.capacity())
		}
	}
	for i, off := range offs {
		if got, want := string(a.at(off, len("value-0000"))), fmt.Sprintf("value-%04d", i); got != want {
			t.Fatalf("value %d reads back as %q", i, got)
		}
	}
	if a.len() <= chunkSize || len(a.chunks) < 2 || len(a.chunks[0]) != chunkSize {
		t.Errorf("%d bytes in %d chunks, the first of %d bytes: want full chunks past the first", a.len(), len(a.chunks), len(a.chunks[0]))
	}
}
