package kafkaclient

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// recordTimeBytes bounds what one partition's fetch returns: the first
// batch at the offset is all a timestamp needs (a broker returns a first
// batch larger than this whole).
const recordTimeBytes = 64 << 10

// RecordTimes returns the timestamp of the first record at or after each
// offset of at (topic → partition → offset), with one fetch per partition
// leader: how old the oldest record a consumer has not committed is, for
// a partition no consumer is fetching. A partition whose record cannot be
// fetched (the offset is not in the log, or there is no record past it)
// is left out; only a failure to reach the cluster at all is an error.
func RecordTimes(ctx context.Context, cl *kgo.Client, at map[string]map[int32]int64) (map[string]map[int32]time.Time, error) {
	out := map[string]map[int32]time.Time{}
	if len(at) == 0 {
		return out, nil
	}
	topics := slices.Sorted(maps.Keys(at))
	meta, err := kadm.NewClient(cl).Metadata(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("topic metadata: %w", err)
	}
	byLeader := map[int32]*kmsg.FetchRequest{}
	names := map[[16]byte]string{}
	for _, t := range topics {
		td, ok := meta.Topics[t]
		if !ok || td.Err != nil {
			continue
		}
		names[td.ID] = t
		for p, off := range at[t] {
			pd, ok := td.Partitions[p]
			if !ok || pd.Err != nil || pd.Leader < 0 {
				continue
			}
			req := byLeader[pd.Leader]
			if req == nil {
				req = kmsg.NewPtrFetchRequest()
				req.MaxWaitMillis = 0
				req.MinBytes = 1
				req.MaxBytes = 16 * recordTimeBytes
				byLeader[pd.Leader] = req
			}
			i := slices.IndexFunc(req.Topics, func(rt kmsg.FetchRequestTopic) bool { return rt.Topic == t })
			if i < 0 {
				rt := kmsg.NewFetchRequestTopic()
				rt.Topic, rt.TopicID = t, td.ID
				req.Topics = append(req.Topics, rt)
				i = len(req.Topics) - 1
			}
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, off, recordTimeBytes
			rp.CurrentLeaderEpoch, rp.LastFetchedEpoch, rp.LogStartOffset = -1, -1, -1
			req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		}
	}
	dec := kgo.DefaultDecompressor()
	var firstErr error
	for leader, req := range byLeader {
		resp, err := req.RequestWith(ctx, cl.Broker(int(leader)))
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("fetch from broker %d: %w", leader, err)
			}
			continue
		}
		for _, rt := range resp.Topics {
			t := rt.Topic
			if t == "" {
				t = names[rt.TopicID]
			}
			for i := range rt.Partitions {
				rp := &rt.Partitions[i]
				off, ok := at[t][rp.Partition]
				if !ok {
					continue
				}
				fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, Topic: t, Partition: rp.Partition}, rp, dec, nil)
				if fp.Err != nil || len(fp.Records) == 0 {
					continue
				}
				if out[t] == nil {
					out[t] = map[int32]time.Time{}
				}
				out[t][rp.Partition] = fp.Records[0].Timestamp
			}
		}
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}
