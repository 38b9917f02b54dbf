package projector_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
)

// TestClaimRetriesFollowRetryFlags: while the stored offsets cannot be
// claimed, the engine retries with the partitions' RetryBase and RetryCap
// (--retry-base, --retry-cap) rather than a backoff of its own, and
// finishes the stream once they can.
func TestClaimRetriesFollowRetryFlags(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 50
	b := setup(t, opts, 2)
	// The claim fails (undefined table) until the table is back.
	if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE projector_offsets RENAME TO projector_offsets_away`); err != nil {
		t.Fatal(err)
	}
	const retryCap = 20 * time.Millisecond
	var logs lockedBuffer
	e := b.engine(t, "claimretry", projector.Config{
		Partition: partition.Config{RetryBase: time.Millisecond, RetryCap: retryCap},
		Logger:    slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	run(t, e)

	// Ten retries with a backoff of 100ms doubling up to 10s would take
	// tens of seconds; within the cap they take well under one.
	const attempts = 10
	var delays []time.Duration
	testenv.WaitFor(t, 30*time.Second, func() error {
		delays = claimDelays(t, logs.String())
		if len(delays) < attempts {
			return fmt.Errorf("%d claim retries logged, want %d", len(delays), attempts)
		}
		return nil
	})
	for i, d := range delays {
		if d < 0 || d > retryCap {
			t.Errorf("claim retry %d waited %v, want within [0, %v]", i+1, d, retryCap)
		}
	}
	if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE projector_offsets_away RENAME TO projector_offsets`); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "claimretry")
}

// claimDelays returns the delays of the engine's logged retries of claims.
func claimDelays(t *testing.T, logs string) []time.Duration {
	t.Helper()
	var out []time.Duration
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var line struct {
			What  string        `json:"what"`
			Delay time.Duration `json:"delay"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			continue // a line cut short while the engine writes it
		}
		if line.What == "claim partitions" {
			out = append(out, line.Delay)
		}
	}
	return out
}
