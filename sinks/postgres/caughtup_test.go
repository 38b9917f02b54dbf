package postgres_test

import (
	"testing"
	"time"

	"github.com/projector-dev/projector/sinks"
)

// TestCommitRecordsCaughtUp: a commit that reaches the high watermark
// records when, in projector_offsets.caught_up_at; one behind leaves the
// last time; an idle partition's mark records it again, unless the claim
// is no longer the newest or the offset moved.
func TestCommitRecordsCaughtUp(t *testing.T) {
	e := newEnv(t, demoProjection(t))
	c := e.claimAll(1)[0]
	caughtUp := func() *time.Time {
		t.Helper()
		var at *time.Time
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT caught_up_at FROM projector_offsets WHERE topic = $1 AND partition = 0`, c.Topic).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	if at := caughtUp(); at != nil {
		t.Fatalf("caught up at %v before any commit", at)
	}
	e.mustCommit(&c, 1, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 1, "ann", 1)}})
	if at := caughtUp(); at != nil {
		t.Fatalf("a commit behind recorded caught up at %v", at)
	}
	c.CaughtUp = true
	e.mustCommit(&c, 2, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 2, "ann", 2)}})
	first := caughtUp()
	if first == nil {
		t.Fatal("a commit reaching the high watermark recorded nothing")
	}
	c.CaughtUp = false
	e.mustCommit(&c, 3, sinks.Changes{Upserts: []sinks.RowWrite{upsert("a1", 3, "ann", 3)}})
	if at := caughtUp(); at == nil || !at.Equal(*first) {
		t.Fatalf("a commit behind changed caught up from %v to %v", first, at)
	}

	if err := e.sink.MarkCaughtUp(e.ctx, c); err != nil {
		t.Fatal(err)
	}
	marked := caughtUp()
	if marked == nil || !marked.After(*first) {
		t.Fatalf("the idle mark left caught up at %v (was %v)", marked, first)
	}
	stale := c
	stale.NextOffset = 2
	if err := e.sink.MarkCaughtUp(e.ctx, stale); err != nil {
		t.Fatal(err)
	}
	stale = c
	stale.Epoch--
	if err := e.sink.MarkCaughtUp(e.ctx, stale); err != nil {
		t.Fatal(err)
	}
	if at := caughtUp(); !at.Equal(*marked) {
		t.Fatalf("a mark of an old offset or an old claim moved caught up from %v to %v", marked, at)
	}
}
