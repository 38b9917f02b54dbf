package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

// produceGarbage writes n records to partition 0 whose values are not
// Avro at all: each is dead-lettered (class decode), and many in a row
// make a dead-letter storm.
func (e *offsetsEnv) produceGarbage(n int) {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: e.kafka.Topic, Partition: 0, Key: []byte("garbage-" + strconv.Itoa(i)), Value: []byte("not avro at all")}
	}
	if err := cl.ProduceSync(e.t.Context(), recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// opened are the AccountOpened events offsetsEnv.produce writes for
// prefix-from … prefix-(to-1), for the reference fold.
func opened(prefix string, from, to int) []demo.Record {
	var out []demo.Record
	for i := from; i < to; i++ {
		id := prefix + strconv.Itoa(i)
		out = append(out, demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "o"}})
	}
	return out
}

// waitHaltShown polls projector status until it shows partition 0 halted
// by halt, with a reason holding why and the time the halt began (between
// began and seen, when the test saw it halted), in --json and in the
// table's reason line.
func (e *offsetsEnv) waitHaltShown(halt, why string, began, seen time.Time) {
	e.t.Helper()
	testenv.WaitFor(e.t, 30*time.Second, func() error {
		p0 := e.status()[0]
		if p0.State != "halted" || p0.Halt != halt || !strings.Contains(p0.Reason, why) || p0.Since == nil || p0.Member == "" {
			return fmt.Errorf("status of partition 0: state %q, halt %q, reason %q, since %v, member %q; want halted (%s) saying %q, since when, by which member",
				p0.State, p0.Halt, p0.Reason, p0.Since, p0.Member, halt, why)
		}
		if p0.Since.Before(began) || p0.Since.After(seen) {
			return fmt.Errorf("status says partition 0 halted since %s, want when it halted: between %s and %s", p0.Since, began, seen)
		}
		if table := e.mustCLI("status"); !strings.Contains(table, fmt.Sprintf("/0 halted (%s) since ", halt)) {
			return fmt.Errorf("status table shows no %s halt:\n%s", halt, table)
		}
		return nil
	})
}

// waitResumed polls until the live member runs partition 0 again: no
// halt in its workers, /readyz's partitions check passes, the gauge of the
// halt is 0 and the stored offset is at end.
func (e *offsetsEnv) waitResumed(live *projector.Engine, reg prometheus.Gatherer, gauge string, end int64) {
	e.t.Helper()
	testenv.WaitFor(e.t, 3*projector.ResetCheckInterval, func() error {
		for _, s := range live.Workers() {
			if s.Halted != "" {
				return fmt.Errorf("partition %d still halted (%s): %s", s.Partition, s.HaltKind, s.Halted)
			}
		}
		if err := live.Ready(e.t.Context())["partitions"]; err != nil {
			return fmt.Errorf("/readyz partitions check: %w", err)
		}
		if g := metricSum(e.t, reg, gauge); g != 0 {
			return fmt.Errorf("%s sums to %v, want 0", gauge, g)
		}
		if next, _ := e.stored(0); next == nil || *next != end {
			return fmt.Errorf("stored offset %s, want %d", orDash(next), end)
		}
		return nil
	})
	// The member clears the state it recorded at its next look.
	testenv.WaitFor(e.t, 30*time.Second, func() error {
		if p0 := e.status()[0]; p0.State != stateOK || p0.Halt != "" {
			return fmt.Errorf("status of partition 0 after the reset: %+v, want ok", p0)
		}
		return nil
	})
}

// TestResetReleasesDeadLetterStorm: records that are not Avro are
// dead-lettered until the storm guard judges (80 of them, committed),
// then halt the partition for a dead-letter storm; projector status shows
// the halt, what halted it and since when. The operator skips the records
// with offsets reset --execute: the live member takes the partition up
// from the new offset without a restart (/readyz passes, the storm gauge
// is 0), and its storm guard judges the records after the reset afresh: a
// single bad record among them is dead-lettered as any would be, where
// the 80 dead letters before the reset would have made it a storm again.
// The table equals the reference fold of the good records.
func TestResetReleasesDeadLetterStorm(t *testing.T) {
	// Waits on processes and timeouts more than it computes: run beside
	// the other long tests of its kind.
	t.Parallel()
	e := newOffsetsEnv(t, 1)
	e.produce(0, "good-", 0, 10, nil)
	reg := prometheus.NewRegistry()
	live, stop := e.engine(reg)
	e.waitStored(0, 10)

	e.produceGarbage(80)
	e.waitStored(0, 90)
	began := time.Now()
	e.produceGarbage(100)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if g := metricSum(t, reg, "projector_partition_dead_letter_storm"); g != 1 {
			return fmt.Errorf("projector_partition_dead_letter_storm = %v, want 1", g)
		}
		return nil
	})
	seen := time.Now()
	if err := live.Ready(t.Context())["partitions"]; err == nil || !strings.Contains(err.Error(), "dead-letter storm") {
		t.Errorf("/readyz partitions check while halted: %v, want the storm", err)
	}
	e.waitHaltShown(sinks.HaltDeadLetterStorm, "dead-letter storm", began, seen)

	out := e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--partitions", "0", "--to-latest", "--execute", "--actor", "alice")
	if !strings.Contains(out, "moved 1 stored offsets") {
		t.Fatalf("reset --execute output:\n%s", out)
	}
	e.produce(0, "after-", 0, 20, nil)
	e.produceGarbage(1)
	e.produce(0, "after-", 20, 25, nil)
	e.waitResumed(live, reg, "projector_partition_dead_letter_storm", 10+180+20+1+5)
	stop()

	var dead int
	if err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_dead_letters WHERE partition = 0 AND "offset" = $1`, 10+180+20).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 1 {
		t.Errorf("the bad record after the reset has %d dead letters, want 1", dead)
	}

	if err := demo.Verify(t.Context(), e.db.Pool, demo.Table, demo.Fold(append(opened("good-", 0, 10), opened("after-", 0, 25)...))); err != nil {
		t.Error(err)
	}
}

// TestResetReleasesLostOffset: retention deletes records beyond the
// stored offset while no member runs, so the partition halts when a
// member starts; projector status names the halt records-deleted with
// its reason and since when. offsets reset --to-earliest --execute
// releases it: the live member resumes from the log start without a
// restart, projector_partition_halted is 0, /readyz passes, and the
// records produced after the reset land as the reference fold says.
func TestResetReleasesLostOffset(t *testing.T) {
	// Waits on processes and timeouts more than it computes: run beside
	// the other long tests of its kind.
	t.Parallel()
	e := newOffsetsEnv(t, 1)
	e.produce(0, "old-", 0, 10, nil)
	_, stop := e.engine(nil)
	e.waitStored(0, 10)
	stop()
	e.produce(0, "old-", 10, 30, nil)
	e.kafka.DeleteRecords(e.kafka.Topic, 0, 20)

	began := time.Now()
	reg := prometheus.NewRegistry()
	live, stop := e.engine(reg)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if g := metricSum(t, reg, "projector_partition_halted"); g != 1 {
			return errors.New("partition 0 not halted yet")
		}
		return nil
	})
	e.waitHaltShown(sinks.HaltRecordsDeleted, "deleted by retention", began, time.Now())

	e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--partitions", "0", "--to-earliest", "--execute", "--actor", "alice")
	e.produce(0, "new-", 0, 5, nil)
	e.waitResumed(live, reg, "projector_partition_halted", 35)
	stop()

	want := append(append(opened("old-", 0, 10), opened("old-", 20, 30)...), opened("new-", 0, 5)...)
	if err := demo.Verify(t.Context(), e.db.Pool, demo.Table, demo.Fold(want)); err != nil {
		t.Error(err)
	}
}
