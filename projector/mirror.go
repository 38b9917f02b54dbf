package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/sinks"
)

// DefaultKafkaCommitInterval is how often a member commits its stored
// offsets to its Kafka consumer group unless told otherwise.
const DefaultKafkaCommitInterval = time.Second

// mirrorFlushTimeout bounds the commit a member makes to its group as it
// gives partitions up (revoked, or shutting down): the rebalance, or the
// exit within the pod's grace period, waits for it, and the group's
// offsets are not worth more than a few seconds of either.
const mirrorFlushTimeout = 3 * time.Second

// mirrorLogEvery is how often a failing commit to the group is logged.
const mirrorLogEvery = time.Minute

// groupMirror commits the offsets the member stored in Postgres to its
// Kafka consumer group too, so that Kafka's own tools, Burrow and
// autoscalers see the group's lag. The group's offsets are advisory:
// nothing reads them back (a partition starts from its stored offset),
// and a failed commit is counted, logged at most once a minute and tried
// again with the next one.
//
// The commits go through the member's own group client, under its
// current generation (or member epoch): the broker refuses a commit to an
// active group from outside it. Only the partitions the member owns are
// committed: a partition is added when its worker starts and removed,
// after one last commit, when it is revoked, and without one when it is
// lost or its worker is fenced. The filter runs just before the request
// leaves (see filter), and the commit made on revoke waits for any in
// flight, so no commit of a partition leaves after it was given up: the
// next owner's commits are never overwritten by older offsets.
type groupMirror struct {
	every    time.Duration
	logEvery time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu sync.Mutex
	// at holds each owned partition's stored next offset, the epoch its
	// worker claimed it with, and what was last committed to the group.
	at map[sinks.TP]*mirrored
	// failed counts the failures since failure was last logged, at
	// when.
	failed   int
	loggedAt time.Time

	commits, failures prometheus.Counter
	lastCommit        prometheus.Gauge
}

type mirrored struct {
	epoch  int64
	offset int64 // stored next offset
	sent   int64 // last committed to the group; -1: none by this member
}

// newGroupMirror returns the mirror of an engine committing every every
// (nil when every is negative: the group is left alone).
func newGroupMirror(every time.Duration, log *slog.Logger, now func() time.Time, reg prometheus.Registerer, labels prometheus.Labels) *groupMirror {
	if every < 0 {
		return nil
	}
	m := &groupMirror{
		every: every, logEvery: mirrorLogEvery, log: log, now: now,
		at: map[sinks.TP]*mirrored{},
		commits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "projector_kafka_offset_commits_total", ConstLabels: labels,
			Help: "Commits of the stored offsets to the identity's Kafka consumer group that the brokers accepted (advisory: for Kafka's tools, Burrow and autoscalers; the offsets in Postgres are the truth).",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "projector_kafka_offset_commit_failures_total", ConstLabels: labels,
			Help: "Commits of the stored offsets to the identity's Kafka consumer group that failed or that the brokers refused for a partition; tried again with the next commit, never fatal (the lag Kafka's tools show lags behind meanwhile).",
		}),
		lastCommit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_kafka_offset_commit_last_success_timestamp_seconds", ConstLabels: labels,
			Help: "Unix time of the last commit of the stored offsets to the identity's Kafka consumer group that the brokers accepted; 0: none yet.",
		}),
	}
	reg.MustRegister(m.commits, m.failures, m.lastCommit)
	return m
}

// own starts mirroring a partition a worker claimed with epoch, from its
// stored next offset.
func (m *groupMirror) own(tp sinks.TP, epoch, offset int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sent := int64(-1)
	if old := m.at[tp]; old != nil {
		sent = old.sent
	}
	m.at[tp] = &mirrored{epoch: epoch, offset: offset, sent: sent}
}

// stored notes the stored next offset of a partition after a commit of
// the worker that claimed it with epoch: one of an earlier worker, or of
// a partition no longer owned, is ignored.
func (m *groupMirror) stored(tp sinks.TP, epoch, offset int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.at[tp]; cur != nil && cur.epoch == epoch {
		cur.offset = offset
	}
}

// drop stops mirroring partitions, committing nothing more of them.
func (m *groupMirror) drop(tps map[string][]int32) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for t, ps := range tps {
		for _, p := range ps {
			delete(m.at, sinks.TP{Topic: t, Partition: p})
		}
	}
}

// dropOne stops mirroring a partition whose worker claimed it with epoch
// (a newer claim's is kept).
func (m *groupMirror) dropOne(tp sinks.TP, epoch int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.at[tp]; cur != nil && cur.epoch == epoch {
		delete(m.at, tp)
	}
}

// due returns the stored offsets not yet committed to the group, of the
// partitions in only (nil: of all owned).
func (m *groupMirror) due(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out map[string]map[int32]kgo.EpochOffset
	add := func(tp sinks.TP, at *mirrored) {
		if at.offset == at.sent {
			return
		}
		if out == nil {
			out = map[string]map[int32]kgo.EpochOffset{}
		}
		if out[tp.Topic] == nil {
			out[tp.Topic] = map[int32]kgo.EpochOffset{}
		}
		out[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: at.offset}
	}
	if only == nil {
		for tp, at := range m.at {
			add(tp, at)
		}
		return out
	}
	for t, ps := range only {
		for _, p := range ps {
			tp := sinks.TP{Topic: t, Partition: p}
			if at := m.at[tp]; at != nil {
				add(tp, at)
			}
		}
	}
	return out
}

// filter drops from a commit about to leave the partitions no longer
// owned: one given up after the commit was put together must not be
// committed by this member again.
func (m *groupMirror) filter(req *kmsg.OffsetCommitRequest) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		ps := t.Partitions[:0]
		for _, p := range t.Partitions {
			if m.at[sinks.TP{Topic: t.Topic, Partition: p.Partition}] != nil {
				ps = append(ps, p)
			}
		}
		if t.Partitions = ps; len(ps) > 0 {
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	return nil
}

// run commits the due offsets every m.every until ctx ends, one commit
// at a time: a member committing thousands of transactions a second
// sends the group one commit a second, of the latest offset of each
// partition that moved.
func (m *groupMirror) run(ctx context.Context, cl *kgo.Client) {
	if m == nil {
		return
	}
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.commit(ctx, cl, nil, false)
	}
}

// flush commits the due offsets of the partitions in only (nil: all
// owned) and waits for the answer, within mirrorFlushTimeout: for a
// member giving partitions up, whose context may have ended already.
func (m *groupMirror) flush(cl *kgo.Client, only map[string][]int32) {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), mirrorFlushTimeout)
	defer cancel()
	m.commit(ctx, cl, only, true)
}

// commit commits the due offsets of the partitions in only (nil: all
// owned) and returns once the brokers have answered. sync waits for any
// commit in flight first and lets no other start until it is done.
func (m *groupMirror) commit(ctx context.Context, cl *kgo.Client, only map[string][]int32, sync bool) {
	offsets := m.due(only)
	if len(offsets) == 0 {
		return
	}
	done := make(chan struct{})
	onDone := func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		defer close(done)
		m.answered(offsets, req, resp, err)
	}
	ctx = kgo.PreCommitFnContext(ctx, m.filter)
	if sync {
		cl.CommitOffsetsSync(ctx, offsets, onDone)
	} else {
		cl.CommitOffsets(ctx, offsets, onDone)
	}
	<-done
}

// answered records the brokers' answer to a commit of offsets: the
// partitions they accepted are committed up to the offset sent, and a
// failure is counted and, at most once every logEvery, logged.
func (m *groupMirror) answered(offsets map[string]map[int32]kgo.EpochOffset, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil && resp != nil {
		for _, t := range resp.Topics {
			name := t.Topic
			if name == "" { // answers by topic ID name no topic
				name = topicOfID(req, t.TopicID)
			}
			for _, p := range t.Partitions {
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					err = fmt.Errorf("%s/%d: %w", name, p.Partition, perr)
					continue
				}
				tp := sinks.TP{Topic: name, Partition: p.Partition}
				if at := m.at[tp]; at != nil {
					at.sent = offsets[name][p.Partition].Offset
				}
			}
		}
	}
	if errors.Is(err, context.Canceled) {
		// The member is stopping: the commit as it leaves follows.
		return
	}
	if err != nil {
		m.failures.Inc()
		m.failed++
		if now := m.now(); m.loggedAt.IsZero() || now.Sub(m.loggedAt) >= m.logEvery {
			// A commit that meets a rebalance is refused as a matter of
			// course; the next one, under the new generation, succeeds.
			level := slog.LevelWarn
			if rebalancing(err) {
				level = slog.LevelInfo
			}
			m.log.Log(context.Background(), level, "committing the stored offsets to the Kafka consumer group failed; retried with the next commit (advisory: only Kafka's tools and autoscalers see the group's lag fall behind)",
				"failures", m.failed, "err", err)
			m.loggedAt, m.failed = now, 0
		}
		return
	}
	if resp != nil && len(resp.Topics) > 0 { // else every partition was given up meanwhile
		m.commits.Inc()
		m.lastCommit.SetToCurrentTime()
	}
}

// rebalancing reports whether err is a refusal of a commit that met a
// rebalance of the group.
func rebalancing(err error) bool {
	for _, e := range []error{kerr.RebalanceInProgress, kerr.IllegalGeneration, kerr.UnknownMemberID, kerr.StaleMemberEpoch, kerr.FencedMemberEpoch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// topicOfID names the topic of a commit request with the given ID.
func topicOfID(req *kmsg.OffsetCommitRequest, id [16]byte) string {
	if req == nil {
		return ""
	}
	for _, t := range req.Topics {
		if t.TopicID == id {
			return t.Topic
		}
	}
	return ""
}
