package postgres

// arena holds a partition cache's keys and rows in chunks of chunkSize
// bytes. Appending never moves what it holds: a cache grown as one slice
// copied everything it held each time it grew, many times while a
// large cache filled from nothing, and held the old and the new slice at
// once while copying. Each value lies within one allocation; an offset names a chunk
// (offset / chunkSize) and a position in it. The first chunk starts at
// firstChunk bytes and doubles (copied) as it fills, up to chunkSize: a
// member owning thousands of partitions that each cache a few aggregates
// took a whole chunk for each, far more than the cache counted.
type arena struct {
	// chunks[i] holds the offsets from i*chunkSize on. A value longer
	// than a chunk takes an allocation of its own, given as consecutive
	// chunks that each extend to its end. Only chunks[0] may be shorter
	// than chunkSize, while it is the only chunk.
	chunks [][]byte
	n      int // the offset of the next value: every byte below it is taken
}

const (
	chunkBits = 16
	chunkSize = 1 << chunkBits
	chunkMask = chunkSize - 1
	// firstChunk is the least the first chunk takes: a power of two, so
	// that doubling it reaches chunkSize.
	firstChunk = 256
)

// len is the bytes the arena has handed out, the unused ends of chunks
// that a value did not fit included.
func (a *arena) len() int { return a.n }

// capacity is the bytes its chunks take.
func (a *arena) capacity() int {
	if len(a.chunks) == 0 {
		return 0
	}
	return (len(a.chunks)-1)*chunkSize + min(len(a.chunks[0]), chunkSize)
}

// at is the n bytes at offset off, as add placed them.
func (a *arena) at(off uint32, n int) []byte {
	if n == 0 {
		return nil // an empty value's offset may be where no chunk is yet
	}
	c := a.chunks[off>>chunkBits]
	o := int(off & chunkMask)
	return c[o : o+n]
}

// add appends b to a in one piece and returns its offset: in the current
// chunk when b fits in what it has left (the first chunk growing towards
// chunkSize), at the start of a new chunk otherwise.
func add[T string | []byte](a *arena, b T) uint32 {
	if len(b) == 0 {
		return uint32(a.n)
	}
	if len(b) > a.capacity()-a.n && !a.growFirst(len(b)) {
		a.n = len(a.chunks) * chunkSize // the rest of the current chunk stays unused
		if len(b) <= chunkSize {
			a.chunks = append(a.chunks, make([]byte, chunkSize))
		} else {
			k := (len(b) + chunkMask) / chunkSize
			big := make([]byte, k*chunkSize)
			for i := range k {
				a.chunks = append(a.chunks, big[i*chunkSize:])
			}
		}
	}
	off := uint32(a.n)
	copy(a.at(off, len(b)), b)
	a.n += len(b)
	return off
}

// growFirst makes room for n more bytes in the first chunk, while it is
// the only one and they fit in chunkSize, doubling it from firstChunk as
// often as needed. It reports whether it did.
func (a *arena) growFirst(n int) bool {
	if len(a.chunks) > 1 || a.n+n > chunkSize {
		return false
	}
	size := firstChunk
	if len(a.chunks) == 1 {
		size = len(a.chunks[0])
	}
	for size < a.n+n {
		size *= 2
	}
	c := make([]byte, size)
	if len(a.chunks) == 1 {
		copy(c, a.chunks[0][:a.n])
		a.chunks[0] = c
	} else {
		a.chunks = append(a.chunks, c)
	}
	return true
}
