package freshness

import "github.com/twmb/franz-go/pkg/kgo"

// keyPartitioner maps a record key to its partition as Kafka's default
// partitioner does (the Java client's and franz-go's
// StickyKeyPartitioner): murmur2 of the key's bytes, made positive,
// modulo the partition count.
// A keyed record's partition depends on nothing the partitioner keeps,
// so one serves every topic and goroutine.
var keyPartitioner = kgo.StickyKeyPartitioner(nil).ForTopic("")

// PartitionOf is the partition of a topic of n partitions that a record
// keyed key goes to under Kafka's default partitioner. The engine
// requires each record's key to be its aggregate id's text (see
// docs/projections.md), so that it is the partition that owns the
// aggregate unless the producer chose partitions some other way.
func PartitionOf(key string, n int) int32 {
	if n <= 0 {
		return -1
	}
	return int32(keyPartitioner.Partition(&kgo.Record{Key: []byte(key)}, n))
}
