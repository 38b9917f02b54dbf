package projector_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// partitionGauge returns name's sample for partition p of reg, and
// whether there is one.
func partitionGauge(t *testing.T, reg prometheus.Gatherer, name string, p int32) (float64, bool) {
	t.Helper()
	for _, m := range metrics(t, reg, name) {
		if label(m, "partition") == strconv.Itoa(int(p)) {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// A partition that no member of the group runs still has its lag
// exported, by one member only: here partitions added to the topic, which
// the group has not assigned yet, with an hour-old backlog. The two
// members each run one of the first two partitions; of the new one,
// exactly one exports the records behind and their real age, not 0, so a
// sum over the fleet counts them once. Under the classic protocol, whose
// members learn of new partitions at their next metadata refresh; under
// the consumer protocol the coordinator assigns them at once (see
// TestStoppedStaticMemberPartitionLag for that protocol).
func TestUnownedPartitionLag(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 2)
	f.produceTo(t, 0, opened("p0-", 0, 10))
	f.produceTo(t, 1, opened("p1-", 0, 10))
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	for _, reg := range regs {
		e := f.engine(t, "fleet", projector.Config{Registerer: reg})
		projector.SetLagWatch(e, 100*time.Millisecond)
		run(t, e)
	}
	f.verifyPart(t, "fleet", append(opened("p0-", 0, 10), opened("p1-", 0, 10)...))
	testenv.WaitFor(t, 30*time.Second, func() error {
		for i, reg := range regs {
			if n := gauge(t, reg, "projector_partitions_assigned"); n != 1 {
				return fmt.Errorf("member %d holds %v partitions, want 1", i, n)
			}
		}
		return nil
	})

	// Partition 2 appears, with records an hour old; the members' clients
	// learn of it only at their next metadata refresh, minutes away.
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.kafka.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreatePartitions(ctx, 1, f.kafka.Topic); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for i, r := range opened("p2-", 0, 7) {
		value, err := f.enc.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: f.kafka.Topic, Partition: 2, Key: []byte(r.Key), Value: value, Timestamp: old.Add(time.Duration(i) * time.Second)}
		// The broker may not know the new partition at once.
		testenv.WaitFor(t, 10*time.Second, func() error {
			err := cl.ProduceSync(ctx, rec).FirstErr()
			if err != nil {
				cl.ForceMetadataRefresh()
			}
			return err
		})
	}
	var exporters []int
	testenv.WaitFor(t, 30*time.Second, func() error {
		exporters = nil
		for i, reg := range regs {
			lag, ok := partitionGauge(t, reg, "projector_consumer_lag", 2)
			if !ok {
				continue
			}
			exporters = append(exporters, i)
			if lag != 7 {
				return fmt.Errorf("member %d: projector_consumer_lag of partition 2 = %v, want 7", i, lag)
			}
			age, _ := partitionGauge(t, reg, "projector_consumer_lag_seconds", 2)
			if age < time.Hour.Seconds() || age > time.Hour.Seconds()+120 {
				return fmt.Errorf("member %d: projector_consumer_lag_seconds of partition 2 = %v, want the first record's age, about 3600", i, age)
			}
		}
		if len(exporters) == 0 {
			return fmt.Errorf("no member exports the lag of partition 2")
		}
		return nil
	})
	if len(exporters) != 1 {
		t.Errorf("members %v export the lag of partition 2, want exactly one", exporters)
	}
	// With their own partitions, the fleet exports each partition at most
	// once (a member's own partition has a lag series once its worker
	// has seen the log end).
	seen := map[string]int{}
	for _, reg := range regs {
		for _, m := range metrics(t, reg, "projector_consumer_lag") {
			seen[label(m, "partition")]++
		}
	}
	for p, n := range seen {
		if n > 1 {
			t.Errorf("partition %s has %d lag series across the members, want one", p, n)
		}
	}
}

// A static member (InstanceID) that stops does not leave its group, which
// goes on assigning it its partitions until its session times out. It
// records them released as it stops, and the member still running
// exports their lag meanwhile, with the real age of the records waiting.
// Under either group protocol, whose groups are described by different
// requests.
func TestStoppedStaticMemberPartitionLag(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) { testStoppedStaticMemberPartitionLag(t, protocol) })
	}
}

func testStoppedStaticMemberPartitionLag(t *testing.T, protocol string) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 2, quickGroups)
	f.produceTo(t, 0, opened("p0-", 0, 10))
	f.produceTo(t, 1, opened("p1-", 0, 10))
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	var engines []*projector.Engine
	var stops []func()
	for i, reg := range regs {
		cfg := groupConfig(protocol, projector.Config{Registerer: reg, InstanceID: fmt.Sprintf("member-%d", i)})
		if protocol == projector.GroupProtocolClassic {
			cfg.SessionTimeout = time.Minute // the stopped member is not dropped while the test runs
		}
		e := f.engine(t, "static", cfg)
		projector.SetLagWatch(e, 100*time.Millisecond)
		stops = append(stops, run(t, e))
		engines = append(engines, e)
	}
	f.verifyPart(t, "static", append(opened("p0-", 0, 10), opened("p1-", 0, 10)...))
	testenv.WaitFor(t, 30*time.Second, func() error {
		for i, e := range engines {
			if n := len(e.Workers()); n != 1 {
				return fmt.Errorf("member %d runs %d partitions, want 1", i, n)
			}
		}
		return nil
	})
	gone := engines[1].Workers()[0].Partition
	stops[1]()

	cl, err := kgo.NewClient(kgo.SeedBrokers(f.kafka.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	old := time.Now().Add(-time.Hour)
	for i, r := range opened("late-", 0, 4) {
		value, err := f.enc.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: f.kafka.Topic, Partition: gone, Key: []byte(r.Key), Value: value, Timestamp: old.Add(time.Duration(i) * time.Second)}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		lag, ok := partitionGauge(t, regs[0], "projector_consumer_lag", gone)
		if !ok || lag != 4 {
			return fmt.Errorf("the running member: projector_consumer_lag of the stopped member's partition %d = %v (exported: %v), want 4", gone, lag, ok)
		}
		age, _ := partitionGauge(t, regs[0], "projector_consumer_lag_seconds", gone)
		if age < time.Hour.Seconds() || age > time.Hour.Seconds()+120 {
			return fmt.Errorf("projector_consumer_lag_seconds of partition %d = %v, want about 3600", gone, age)
		}
		return nil
	})
	// The group still assigns the partition to the stopped member: no
	// rebalance moved it.
	if n := len(engines[0].Workers()); n != 1 {
		t.Errorf("the running member runs %d partitions, want its own 1", n)
	}
}
