package projector_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestRebalancesWhileBatchesAreOpen adds and removes members while records
// flow, so partitions move with batches in flight, under each group
// protocol: members joining split the partitions among themselves (no
// partition runs twice), members leaving hand theirs over, to the last
// member at the end. The table must still equal the reference fold, and
// the members must have committed every record once between them.
func TestRebalancesWhileBatchesAreOpen(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) { rebalances(t, protocol) })
	}
}

func rebalances(t *testing.T, protocol string) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 3000, 11
	b := faultSetup(t, opts, 6, quickGroups).bundle
	var reqs *groupRequests
	if !b.kafka.Real() {
		reqs = countGroupRequests(b.kafka.Fake)
	}

	groupOffsets := b.watchGroupOffsets(t, "rebalance")
	regs := map[string]*prometheus.Registry{}
	members := map[string]*projector.Engine{}
	stops := map[string]func(){}
	start := func(name string) {
		regs[name] = prometheus.NewRegistry()
		members[name] = b.engine(t, "rebalance", groupConfig(protocol, projector.Config{
			Partition:  partition.Config{BatchMaxRecords: 50, BatchMaxWait: 20 * time.Millisecond},
			Registerer: regs[name],
			// Often, so that partitions move with commits to the group
			// in flight.
			KafkaCommitInterval: 10 * time.Millisecond,
		}))
		stops[name] = run(t, members[name])
	}
	stop := func(name string) {
		stops[name]()
		delete(members, name)
	}
	// settled waits until the running members own the 6 partitions in
	// the shares want gives, each partition once.
	settled := func(want map[string]int) {
		t.Helper()
		began := time.Now()
		testenv.WaitFor(t, time.Minute, func() error {
			owner := map[int32]string{}
			for name, e := range members {
				ws := e.Workers()
				if len(ws) != want[name] {
					return fmt.Errorf("member %s runs %d partitions, want %d", name, len(ws), want[name])
				}
				for _, w := range ws {
					if other, ok := owner[w.Partition]; ok {
						return fmt.Errorf("partition %d runs in members %s and %s", w.Partition, other, name)
					}
					owner[w.Partition] = name
				}
			}
			if len(owner) != 6 {
				return fmt.Errorf("%d of 6 partitions run", len(owner))
			}
			return nil
		})
		t.Logf("partitions %v %v after the change", want, time.Since(began).Round(time.Millisecond))
	}
	steps := []func(){
		func() { start("a"); settled(map[string]int{"a": 6}) },
		func() { start("b"); settled(map[string]int{"a": 3, "b": 3}) },
		func() { start("c"); settled(map[string]int{"a": 2, "b": 2, "c": 2}) },
		func() { stop("a"); settled(map[string]int{"b": 3, "c": 3}) },
		func() { stop("b"); start("d"); settled(map[string]int{"c": 3, "d": 3}) },
		func() { stop("c"); settled(map[string]int{"d": 6}) },
	}
	all := b.records
	chunk := len(all) / len(steps)
	for i, step := range steps {
		part := all[i*chunk : (i+1)*chunk]
		if i == len(steps)-1 {
			part = all[i*chunk:]
		}
		b.produce(t, part)
		step()
	}
	b.verify(t, "rebalance")
	groupOffsets(b.end)

	var revoked float64
	var rs []*prometheus.Registry
	for _, reg := range regs {
		revoked += counter(t, reg, "projector_partitions_revoked_total")
		rs = append(rs, reg)
	}
	if revoked == 0 {
		t.Errorf("no partition was ever revoked: the test did not rebalance")
	}
	processedOnce(t, all, rs...)
	assertGroupProtocol(t, b, reqs, "rebalance", protocol)
}

// TestFencedOwnerStops claims the partitions behind a running member's
// back, as a newer owner would: the member's next commits are fenced and
// counted, its workers stop, and a later member finishes the stream from
// the stored offsets without applying anything twice.
func TestFencedOwnerStops(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 500
	b := setup(t, opts, 3)

	reg := prometheus.NewRegistry()
	// A batch waits a second for more records: long enough to claim the
	// partitions underneath it.
	e := b.engine(t, "fence", projector.Config{
		Partition:  partition.Config{BatchMaxRecords: 1_000_000, BatchMaxWait: time.Second},
		Registerer: reg,
	})
	stop := run(t, e)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := len(e.Workers()); n < 3 {
			return fmt.Errorf("the member runs %d workers, want 3", n)
		}
		return nil
	})
	offsets := postgres.NewOffsets(b.db.Pool, "fence")
	tps := []sinks.TP{{Topic: b.kafka.Topic, Partition: 0}, {Topic: b.kafka.Topic, Partition: 1}, {Topic: b.kafka.Topic, Partition: 2}}
	if _, err := offsets.Claim(ctx, tps); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := len(e.Workers()); n > 0 {
			return fmt.Errorf("fenced workers did not stop: %d still run", n)
		}
		return nil
	})
	if got := counter(t, reg, "projector_fenced_batches_total"); got != 3 {
		t.Errorf("fenced batches: got %v, want 3", got)
	}
	var rows int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("a fenced batch wrote %d rows", rows)
	}
	stop()

	run(t, b.engine(t, "fence", projector.Config{}))
	b.verify(t, "fence")
}

// TestZombieMemberIsFenced makes a member a zombie: its heartbeats are
// answered by the test, not by the group, so it goes on believing it owns
// its partitions after the group expired it and gave them to another
// member. Its next batches must be fenced by the owner epoch the new owner
// claimed, and nothing it planned may reach the table. Once its heartbeats
// reach the group again it learns that it lost its partitions, rejoins
// and shares them with the other member. The table equals the reference
// fold, and the members committed every record once between them.
func TestZombieMemberIsFenced(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) { zombie(t, protocol) })
	}
}

func zombie(t *testing.T, protocol string) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 600, 3
	// Sessions of 3s, under either protocol: the group expires the
	// zombie sooner.
	b := faultSetup(t, opts, 3, quickGroups, testenv.FakeOpts(kfake.GroupMinSessionTimeout(time.Second),
		kfake.BrokerConfigs(map[string]string{"group.consumer.session.timeout.ms": "3000"}))).bundle
	fake := b.kafka.Embedded("answers the zombie's heartbeats in the group's place")
	reqs := countGroupRequests(fake)
	all := b.records
	third := len(all) / 3
	b.produce(t, all[:third])

	cfg := func(reg prometheus.Registerer) projector.Config {
		c := groupConfig(protocol, projector.Config{Partition: partition.Config{BatchMaxWait: 20 * time.Millisecond}, Registerer: reg})
		if protocol == projector.GroupProtocolClassic {
			c.SessionTimeout = 3 * time.Second
		}
		return c
	}
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := b.engine(t, "zombie", cfg(regA))
	run(t, a)
	b.verifyPart(t, "zombie", all[:third])
	memberA, _ := a.Client().GroupMetadata()

	// From now on the group hears nothing from a, and a hears that all is
	// well, until released.
	var answered atomic.Int64
	var released atomic.Bool
	zombieHeartbeats := func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if released.Load() {
			return nil, nil, false
		}
		switch req := req.(type) {
		case *kmsg.HeartbeatRequest:
			if req.MemberID == memberA {
				answered.Add(1)
				return req.ResponseKind(), nil, true
			}
		case *kmsg.ConsumerGroupHeartbeatRequest:
			if req.MemberID == memberA {
				answered.Add(1)
				resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
				resp.MemberID, resp.MemberEpoch = &req.MemberID, req.MemberEpoch
				resp.HeartbeatIntervalMillis = 100
				return resp, nil, true
			}
		}
		return nil, nil, false
	}
	fake.ControlKey(int16(kmsg.Heartbeat), zombieHeartbeats)
	fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), zombieHeartbeats)

	silent := time.Now()
	bm := b.engine(t, "zombie", cfg(regB))
	run(t, bm)
	testenv.WaitFor(t, time.Minute, func() error {
		if n := len(bm.Workers()); n < 3 {
			return fmt.Errorf("the new member runs %d workers, want 3 (the zombie's heartbeats answered %d times)", n, answered.Load())
		}
		return nil
	})
	t.Logf("the group gave the new member every partition %v after the zombie fell silent", time.Since(silent).Round(time.Millisecond))
	if n := len(a.Workers()); n != 3 {
		t.Fatalf("the zombie runs %d workers, want 3: it must still believe it owns every partition", n)
	}

	b.produce(t, all[third:2*third])
	b.verifyPart(t, "zombie", all[:2*third])
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := counter(t, regA, "projector_fenced_batches_total"); n < 3 {
			return fmt.Errorf("the zombie had %v batches fenced, want one for each of its 3 partitions", n)
		}
		return nil
	})

	released.Store(true)
	back := time.Now()
	testenv.WaitFor(t, time.Minute, func() error {
		lost, na, nb := counter(t, regA, "projector_partitions_lost_total"), len(a.Workers()), len(bm.Workers())
		if lost < 3 || na == 0 || nb == 0 || na+nb != 3 {
			return fmt.Errorf("the zombie lost %v partitions and runs %d workers, the other member %d; want 3 lost and the partitions shared", lost, na, nb)
		}
		return nil
	})
	t.Logf("the zombie heard it lost its partitions and rejoined %v after its heartbeats reached the group", time.Since(back).Round(time.Millisecond))
	b.produce(t, all[2*third:])
	b.verify(t, "zombie")
	processedOnce(t, all, regA, regB)
	assertGroupProtocol(t, b, reqs, "zombie", protocol)
}

// metrics returns the samples of the family name gathered from g.
func metrics(t *testing.T, g prometheus.Gatherer, name string) []*dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// counter sums every sample of a counter or gauge family, or counts the
// observations of a histogram family.
func counter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metrics(t, g, name) {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return sum
}

// histogramSum sums the observed values of a histogram family.
func histogramSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	var sum float64
	for _, m := range metrics(t, g, name) {
		sum += m.GetHistogram().GetSampleSum()
	}
	return sum
}

// bucket returns the observations of a histogram family at most le.
func bucket(t *testing.T, g prometheus.Gatherer, name string, le float64) float64 {
	t.Helper()
	var n float64
	for _, m := range metrics(t, g, name) {
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() == le {
				n += float64(b.GetCumulativeCount())
			}
		}
	}
	return n
}
