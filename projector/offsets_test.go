package projector_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// TestFirstClaimListsOffsetsOnce has one member claim many partitions
// that have no stored offset: their start offsets must be resolved
// together, not by listing the whole topic once per partition, and each
// partition is claimed once. The table then equals the reference fold.
func TestFirstClaimListsOffsetsOnce(t *testing.T) {
	const partitions = 240
	opts := demo.DefaultOptions()
	opts.Aggregates = 600
	b := setup(t, opts, partitions)

	var listed, listedPartitions atomic.Int64
	b.kafka.ControlKey(int16(kmsg.ListOffsets), func(r kmsg.Request) (kmsg.Response, error, bool) {
		listed.Add(1)
		for _, tp := range r.(*kmsg.ListOffsetsRequest).Topics {
			listedPartitions.Add(int64(len(tp.Partitions)))
		}
		return nil, nil, false
	})
	e := b.engine(t, "fresh", projector.Config{})
	run(t, e)
	testenv.WaitFor(t, 60*time.Second, func() error {
		if n := len(e.Workers()); n != partitions {
			return fmt.Errorf("%d of %d partitions claimed", n, partitions)
		}
		return nil
	})
	b.verify(t, "fresh")

	// One request per broker (the test cluster has one); a few more leave
	// room for a retried one.
	if n := listed.Load(); n > 3 {
		t.Errorf("claiming %d fresh partitions sent %d ListOffsets requests listing %d partitions, want one request",
			partitions, n, listedPartitions.Load())
	}
	var claimedTwice int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_offsets WHERE identity = 'fresh' AND owner_epoch <> 1`).Scan(&claimedTwice); err != nil {
		t.Fatal(err)
	}
	if claimedTwice != 0 {
		t.Errorf("%d partitions were claimed more than once by the only member", claimedTwice)
	}
}
