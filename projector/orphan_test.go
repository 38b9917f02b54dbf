package projector_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestOrphanedPartitionIsClaimedBack: a member's partition is claimed by
// a newer owner of the same identity outside its group (as a second
// projector dev on the same database does), which then goes away. The
// group still assigns the partition to the member, so nobody else takes
// it: while its records wait, the partition counts as stalled (the stall
// gauge, /livez), and once the newer owner has moved nothing for
// ReclaimAfter the member claims it back and applies the records; the
// table equals the reference fold.
func TestOrphanedPartitionIsClaimedBack(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	f := faultSetup(t, opts, 1)
	all := f.records
	half := len(all) / 2
	f.produce(t, all[:half])

	reg := prometheus.NewRegistry()
	e := f.engine(t, "orphan", projector.Config{
		Partition:    partition.Config{BatchMaxWait: 20 * time.Millisecond, StallAfter: time.Second},
		ReclaimAfter: 8 * time.Second,
		Registerer:   reg,
	})
	run(t, e)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, f.db.Pool, "orphan", f.kafka.Topic, f.end, nil); err != nil {
		t.Fatal(err)
	}

	// The newer owner claims the partition and then is gone: it never
	// commits.
	if _, err := postgres.NewOffsets(f.db.Pool, "orphan").Claim(ctx, []sinks.TP{{Topic: f.kafka.Topic, Partition: 0}}); err != nil {
		t.Fatal(err)
	}
	f.produce(t, all[half:])
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := len(e.Workers()); n > 0 {
			return fmt.Errorf("the fenced worker still runs")
		}
		if s := counterWith(t, reg, "projector_partition_stalled", "partition", "0"); s != 1 {
			return fmt.Errorf("projector_partition_stalled = %v while the orphan's records wait, want 1", s)
		}
		if err := e.Live(ctx)["partitions"]; err == nil {
			return errors.New("/livez passes while the orphan's records wait")
		}
		return nil
	})

	// Claimed back: the records apply.
	f.records = all
	f.verify(t, "orphan")
	testenv.WaitFor(t, 10*time.Second, func() error {
		if s := counterWith(t, reg, "projector_partition_stalled", "partition", "0"); s != 0 {
			return fmt.Errorf("projector_partition_stalled = %v after the partition was claimed back, want 0", s)
		}
		if err := e.Live(ctx)["partitions"]; err != nil {
			return fmt.Errorf("/livez after the partition was claimed back: %v", err)
		}
		return nil
	})
}
