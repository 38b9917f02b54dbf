package projector

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// A halted partition's error, seen again and again, is logged once and
// then at most once a minute (a new reason is logged at once: see
// TestHaltedPartitionListsBoundsAgain).
func TestHaltLogIsRateLimited(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := &Engine{log: slog.New(slog.NewTextHandler(&out, nil)), now: func() time.Time { return now }}
	lp := &lostPartition{kind: haltRecordsDeleted}
	st := partition.Status{TP: sinks.TP{Topic: "t", Partition: 3}, NextOffset: 10, Halted: "records from offset 10 were deleted"}
	for _, step := range []struct {
		after time.Duration
		kind  string
		logs  bool
	}{
		{0, haltRecordsDeleted, true},
		{time.Millisecond, haltRecordsDeleted, false},
		{30 * time.Second, haltRecordsDeleted, false},
		{30 * time.Second, haltRecordsDeleted, true}, // a minute after the first
		{time.Second, haltRecordsDeleted, false},
	} {
		now = now.Add(step.after)
		out.Reset()
		e.logLost(lp, step.kind, st)
		if got := strings.Count(out.String(), "partition halted"); got != map[bool]int{true: 1}[step.logs] {
			t.Errorf("at %s: %d lines, want logged=%v:\n%s", now.Format(time.TimeOnly), got, step.logs, &out)
		}
	}
}
