package postgres

// arena holds a partition cache's keys and rows in chunks of chunkSize
// bytes. Appending never moves what it holds: a cache grown as one slice
// copied everything it held each time it grew (a partition's slice grew
// some twenty times while a million aggregates were cached from nothing,
// 3% of the consumer's CPU, and held the old and the new slice at once
// while copying). Each value lies within one allocation; an offset names a chunk
// (offset / chunkSize) and a position in it.
type arena struct {
	// chunks[i] holds the offsets from i*chunkSize on. A value longer
	// than a chunk takes an allocation of its own, given as consecutive
	// chunks that each extend to its end.
	chunks [][]byte
	n      int // the offset of the next value: every byte below it is taken
}

const (
	chunkBits = 16
	chunkSize = 1 << chunkBits
	chunkMask = chunkSize - 1
)

// len is the bytes the arena has handed out, the unused ends of chunks
// that a value did not fit included.
func (a *arena) len() int { return a.n }

// capacity is the bytes its chunks take.
func (a *arena) capacity() int { return len(a.chunks) * chunkSize }

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
// chunk when b fits in what it has left, at the start of a new chunk
// otherwise.
func add[T string | []byte](a *arena, b T) uint32 {
	if len(b) == 0 {
		return uint32(a.n)
	}
	if rest := len(a.chunks)*chunkSize - a.n; len(b) > rest {
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
