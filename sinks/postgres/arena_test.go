package postgres

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// Every value an arena was given reads back whole, whatever its length
// against the chunks' (none, a few bytes, the rest of a chunk, longer than
// one), and adding more never changes what it holds.
func TestArenaHoldsEveryValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var a arena
	type placed struct {
		off uint32
		val []byte
	}
	var all []placed
	for i := range 3000 {
		n := rng.IntN(200)
		switch i % 97 {
		case 0:
			n = chunkSize - a.len()%chunkSize // exactly the rest of the chunk
		case 1:
			n = chunkSize + rng.IntN(3*chunkSize) // longer than a chunk
		case 2:
			n = chunkSize // a whole chunk
		}
		val := make([]byte, n)
		for j := range val {
			val[j] = byte(rng.Uint32())
		}
		if i%2 == 0 {
			all = append(all, placed{add(&a, val), val})
		} else {
			all = append(all, placed{add(&a, string(val)), val})
		}
	}
	for i, p := range all {
		if got := a.at(p.off, len(p.val)); !bytes.Equal(got, p.val) {
			t.Fatalf("value %d (%d bytes at %d) reads back differently", i, len(p.val), p.off)
		}
	}
	if a.len() > a.capacity() || a.capacity() > 2*a.len()+chunkSize {
		t.Errorf("%d bytes handed out in %d of chunks", a.len(), a.capacity())
	}
}

// An empty value reads back empty wherever it was added: before any chunk,
// and where the last chunk is full.
func TestArenaEmptyValueAtAChunkBoundary(t *testing.T) {
	var a arena
	if off := add(&a, ""); len(a.at(off, 0)) != 0 {
		t.Fatal("an empty value read back bytes")
	}
	add(&a, make([]byte, chunkSize))
	off := add(&a, []byte{})
	if got := a.at(off, 0); len(got) != 0 || off != chunkSize || a.capacity() != chunkSize {
		t.Errorf("empty value at %d read back %d bytes, capacity %d", off, len(got), a.capacity())
	}
}
