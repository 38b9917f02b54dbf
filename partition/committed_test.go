package partition

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/projector-dev/projector/sinks"
)

// committedCall is one call of Config.Committed, with what the sink held
// when it was made.
type committedCall struct {
	tp         sinks.TP
	end        int64
	keys       []string
	storedNext int64
	missing    []string // keys whose row the sink did not hold at the version written
}

// Config.Committed is called after each transaction has committed, and
// only then: a reader waiting in it for an offset finds the rows of every
// record before it in the table, whether the worker commits batch by
// batch or several batches at once, and a transaction that failed and
// was tried again is reported once.
func TestCommittedHookFollowsCommit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxBatches int
	}{{"batch by batch", 1}, {"several batches per transaction", 8}} {
		t.Run(tc.name, func(t *testing.T) {
			const accounts, versions, batch = 10, 12, 20
			sink := newMemSink()
			sink.fail = errors.New("connection reset by peer") // the first attempt rolls back
			var (
				mu    sync.Mutex
				calls []committedCall
			)
			cfg := Config{BatchMaxRecords: batch, BatchMaxWait: time.Millisecond, CommitMaxBatches: tc.maxBatches,
				RetryBase: time.Millisecond, RetryCap: time.Millisecond}
			cfg.Committed = func(tp sinks.TP, end int64, keys []string) {
				sink.mu.Lock()
				c := committedCall{tp: tp, end: end, keys: keys, storedNext: sink.next}
				for _, k := range keys {
					if _, ok := sink.versions[k]; !ok {
						c.missing = append(c.missing, k)
					}
				}
				sink.mu.Unlock()
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
			events := accountEvents(accounts, 1, versions)
			w, recs := windowWorkerConfig(t, sink, cfg, events)
			w.Push(recs, int64(len(recs)))
			stop := runWorker(t, w)
			waitStored(t, w, len(recs))

			// Records deleted by retention are skipped with a transaction
			// that writes no rows; a reader waiting for an offset past
			// them is told too.
			skipTo := int64(len(recs) + 5)
			if err := w.SkipTo(t.Context(), skipTo); err != nil {
				t.Fatal(err)
			}
			stop()

			mu.Lock()
			defer mu.Unlock()
			sink.mu.Lock()
			defer sink.mu.Unlock()
			committed := 0
			for _, c := range sink.commits {
				if c.err == nil {
					committed++
				}
			}
			if len(sink.commits) == committed {
				t.Fatal("no commit failed: the test did not exercise a rolled-back transaction")
			}
			// The skip commits through the sink too, as a transaction of
			// its own.
			if len(calls) != committed {
				t.Fatalf("hook called %d times for %d committed transactions (the skip's among them)", len(calls), committed)
			}
			seen := map[string]bool{}
			var last int64
			for i, c := range calls {
				if c.tp != w.TP() {
					t.Errorf("call %d: partition %v, want %v", i, c.tp, w.TP())
				}
				if c.end <= last {
					t.Errorf("call %d: end %d after %d; want it to move forward", i, c.end, last)
				}
				last = c.end
				if c.storedNext != c.end {
					t.Errorf("call %d: end %d while the sink has stored %d: called before its transaction committed", i, c.end, c.storedNext)
				}
				if len(c.missing) > 0 {
					t.Errorf("call %d: rows of %v not in the table yet", i, c.missing)
				}
				for _, k := range c.keys {
					seen[k] = true
				}
			}
			if got := calls[len(calls)-2].end; got != int64(len(recs)) {
				t.Errorf("last batch reported up to %d, want %d", got, len(recs))
			}
			if skip := calls[len(calls)-1]; skip.end != skipTo || skip.keys != nil {
				t.Errorf("skip reported as end %d keys %v, want end %d and no keys", skip.end, skip.keys, skipTo)
			}
			var want []string
			for a := range accounts {
				want = append(want, fmt.Sprintf("acc-%02d", a))
			}
			got := make([]string, 0, len(seen))
			for k := range seen {
				got = append(got, k)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("aggregates reported %v, want %v", got, want)
			}
			checkBalances(t, sink, accounts, versions, nil)
		})
	}
}
