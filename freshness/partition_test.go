package freshness_test

import (
	"fmt"
	"testing"

	"github.com/projector-dev/projector/freshness"
)

// javaMurmur2 is Kafka's Utils.murmur2, written from the Java source
// apart from the partitioner under test.
func javaMurmur2(data []byte) int32 {
	const seed uint32 = 0x9747b28c
	const m uint32 = 0x5bd1e995
	const r = 24
	length := len(data)
	h := seed ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	rest := length % 4
	tail := length &^ 3
	switch rest {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// TestJavaMurmur2Vectors checks the reference against the values of
// Kafka's own tests (UtilsTest.testMurmur2).
func TestJavaMurmur2Vectors(t *testing.T) {
	for key, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := javaMurmur2([]byte(key)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestPartitionOf: a key's partition is the Java client's default
// partitioner's, toPositive(murmur2(key)) % n, for many keys and
// partition counts.
func TestPartitionOf(t *testing.T) {
	for _, n := range []int{1, 2, 3, 6, 12, 100} {
		for i := range 20000 {
			key := fmt.Sprintf("account-%d", i)
			want := int32(int64(javaMurmur2([]byte(key))&0x7fffffff) % int64(n))
			if got := freshness.PartitionOf(key, n); got != want {
				t.Fatalf("PartitionOf(%q, %d) = %d, want %d", key, n, got, want)
			}
		}
	}
	if got := freshness.PartitionOf("x", 0); got != -1 {
		t.Fatalf("PartitionOf with no partitions = %d, want -1", got)
	}
}
