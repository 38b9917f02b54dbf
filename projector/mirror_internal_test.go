package projector

import (
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/sinks"
)

// commitRequest is the request a commit of offsets puts on the wire.
func commitRequest(offsets map[string]map[int32]kgo.EpochOffset) *kmsg.OffsetCommitRequest {
	req := kmsg.NewPtrOffsetCommitRequest()
	for t, ps := range offsets {
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic, rt.TopicID = t, [16]byte{1}
		for p, o := range ps {
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset = p, o.Offset
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	return req
}

// answer is the brokers' answer to req, refusing the partitions in refused
// with code. It names each topic by ID alone, as OffsetCommit v10 does.
func answer(req *kmsg.OffsetCommitRequest, code int16, refused ...int32) *kmsg.OffsetCommitResponse {
	resp := kmsg.NewPtrOffsetCommitResponse()
	for _, rt := range req.Topics {
		st := kmsg.NewOffsetCommitResponseTopic()
		st.TopicID = rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewOffsetCommitResponseTopicPartition()
			sp.Partition = rp.Partition
			for _, p := range refused {
				if p == rp.Partition {
					sp.ErrorCode = code
				}
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

func offsetsOf(topic string, at map[int32]int64) map[string]map[int32]kgo.EpochOffset {
	ps := map[int32]kgo.EpochOffset{}
	for p, o := range at {
		ps[p] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	return map[string]map[int32]kgo.EpochOffset{topic: ps}
}

// The mirror commits each owned partition's latest stored offset once:
// a partition that has not moved since its last accepted commit is not
// sent again, a refused one is, and a commit of an earlier claim of the
// partition (a worker replaced after an offset reset) is ignored.
func TestMirrorCommitsEachMoveOnce(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newGroupMirror(time.Second, slog.New(slog.DiscardHandler), func() time.Time { return now }, prometheus.NewRegistry(), nil)
	tp := func(p int32) sinks.TP { return sinks.TP{Topic: "t", Partition: p} }
	m.own(tp(0), 1, 10)
	m.own(tp(1), 1, 20)
	if got, want := m.due(nil), offsetsOf("t", map[int32]int64{0: 10, 1: 20}); !maps.EqualFunc(got, want, maps.Equal) {
		t.Fatalf("due after the claims: %v, want %v", got, want)
	}
	m.stored(tp(0), 1, 15)
	due := m.due(nil)
	req := commitRequest(due)
	m.answered(due, req, answer(req, kerr.RebalanceInProgress.Code, 1), nil)
	if got, want := m.due(nil), offsetsOf("t", map[int32]int64{1: 20}); !maps.EqualFunc(got, want, maps.Equal) {
		t.Errorf("due after partition 1 was refused: %v, want %v (partition 0 was accepted)", got, want)
	}
	// Partition 0 claimed again (an offset reset moved it back): the
	// earlier worker's late commit does not count.
	m.own(tp(0), 2, 3)
	m.stored(tp(0), 1, 16)
	if got := m.due(nil)["t"][0].Offset; got != 3 {
		t.Errorf("partition 0 due at %d after its new claim at 3 and a late commit of the old one, want 3", got)
	}
}

// A commit put together before a partition was given up leaves without
// it: its next owner's offsets are never overwritten by this member's.
func TestMirrorCommitsNothingOfPartitionsGivenUp(t *testing.T) {
	m := newGroupMirror(time.Second, slog.New(slog.DiscardHandler), time.Now, prometheus.NewRegistry(), nil)
	for p := range int32(3) {
		m.own(sinks.TP{Topic: "t", Partition: p}, 1, 100)
	}
	req := commitRequest(m.due(nil))
	m.drop(map[string][]int32{"t": {1}})
	m.dropOne(sinks.TP{Topic: "t", Partition: 2}, 1)
	if err := m.filter(req); err != nil {
		t.Fatal(err)
	}
	var left []int32
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			left = append(left, rp.Partition)
		}
	}
	if len(left) != 1 || left[0] != 0 {
		t.Errorf("the commit carries partitions %v after 1 was revoked and 2 fenced, want [0]", left)
	}
	m.stored(sinks.TP{Topic: "t", Partition: 1}, 1, 200)
	if _, due := m.due(nil)["t"][1]; due {
		t.Error("a revoked partition's late commit made it due again")
	}
}
