package postgres

import (
	"fmt"
	"testing"
)

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
