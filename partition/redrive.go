package partition

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/sinks"
)

// RedriveSource reads the dead letters queued for a partition to be
// applied again by the worker that owns it (a deadletters.Redrives).
type RedriveSource interface {
	// Claim returns the oldest limit redrives queued for tp.
	Claim(ctx context.Context, tp sinks.TP, limit int) ([]sinks.Redrive, error)
}

// Redrive tells the worker that dead letters are queued for its
// partition: it applies up to RedriveMax of them in a transaction of its
// own before its next batch, or at once when it has no records. It never
// blocks; a signal while one is pending is one.
func (w *Worker) Redrive() {
	if w.redrives == nil {
		return
	}
	select {
	case w.redrive <- struct{}{}:
	default:
	}
}

// redriveDue takes a pending Redrive signal.
func (w *Worker) redriveDue() bool {
	select {
	case <-w.redrive:
		return true
	default:
		return false
	}
}

// applyRedrives applies the dead letters queued for the partition, up
// to RedriveMax of them, in one transaction of the worker under its claim,
// with the stored offset unchanged (the epoch check of that transaction
// fences it as any batch's). Each record is decoded and planned through
// its projection's lane as the original was, its dead letter's id in
// the sinks.ReplayHeader header: through the version gate, so a record
// whose version is already applied is stale and resolves its dead
// letter without writing, one that applies resolves it, and one that
// fails again reopens it with one attempt more. The same transaction
// takes them off the queue and audits them. It runs with nothing
// pending (see settleThen).
//
// Redrives whose transaction Postgres refuses stay queued, logged, for
// the next signal: they do not halt the partition's records.
func (w *Worker) applyRedrives(ctx context.Context) error {
	if w.redrives == nil {
		return nil
	}
	var queued []sinks.Redrive
	err := w.retry(ctx, "read queued redrives", func() (err error) {
		queued, err = w.redrives.Claim(ctx, w.claim.TP, w.cfg.RedriveMax)
		return err
	})
	if err != nil || len(queued) == 0 {
		return err
	}
	byLane := make([][]sinks.Redrive, len(w.lanes))
	for _, r := range queued {
		i := w.laneOf(r.Projection)
		if i < 0 {
			if !w.redriveState.strangers[r.Projection] {
				// Once per projection: the engine signals every interval.
				if w.redriveState.strangers == nil {
					w.redriveState.strangers = map[string]bool{}
				}
				w.redriveState.strangers[r.Projection] = true
				w.log.Warn("dead letters queued for redrive are of a projection this partition's worker does not run; they stay queued",
					"projection", r.Projection, "dead_letter", r.DeadLetter)
			}
			continue
		}
		byLane[i] = append(byLane[i], r)
	}
	end := w.claim.NextOffset
	by := fmt.Sprintf("applied by the owner of %s/%d at epoch %d", w.claim.Topic, w.claim.Partition, w.claim.Epoch)
	var bs []laneBatch
	for i, rs := range byLane {
		if len(rs) == 0 {
			continue
		}
		l := w.lanes[i]
		recs := make([]*kgo.Record, len(rs))
		ids := make([]int64, len(rs))
		for j, r := range rs {
			recs[j] = redriveRecord(w.claim.TP, r)
			ids[j] = r.QueueID
		}
		// Every record is taken whatever its offset (-1): they are
		// before the stored offset, committed once already.
		items, _, err := l.items(ctx, recs, -1, nil)
		if err != nil {
			return err
		}
		keys := batchKeys(items, l.gaps.has, nil)
		bs = append(bs, laneBatch{l: l, items: items, keys: keys, rejected: map[string]rejection{},
			changes: sinks.Changes{Redriven: ids, RedrivenBy: by}})
	}
	if len(bs) == 0 {
		return nil
	}
	giveUp := false
	sl := make([]sinks.Lane, len(bs))
	for i := range bs {
		b := &bs[i]
		ids := b.changes.Redriven
		sl[i] = sinks.Lane{Sink: b.l.sink, Keys: b.keys, Plan: func(st sinks.State) (sinks.Changes, error) {
			var err error
			b.changes, b.out, err = b.l.plan(ctx, b.items, b.keys.All, st, nil, b.rejected, giveUp)
			b.changes.Redriven, b.changes.RedrivenBy = ids, by
			return b.changes, err
		}}
	}
	// Through the first of these lanes' sink, as a batch of the lanes it
	// names (see commitLanes).
	commit := func() error { return w.commitAs(ctx, w.claim, end, sl) }
	err = w.retryCommit(ctx, len(queued), &giveUp, commit, func(rej *sinks.RejectedRows) bool {
		if rej.Lane < 0 || rej.Lane >= len(bs) {
			return false
		}
		rejections(bs[rej.Lane].rejected, rej)
		return true
	})
	if errors.Is(err, sinks.ErrFenced) || ctx.Err() != nil || errors.Is(err, errStopped) {
		return err
	}
	if err != nil {
		if !w.redriveState.failing {
			w.log.Warn("redriving dead letters failed; they stay queued and are tried again each time the engine finds them (logged again once they apply)",
				"dead_letters", len(queued), "err", err)
		}
		w.redriveState.failing = true
		return nil
	}
	if w.redriveState.failing {
		w.log.Warn("queued dead letters apply again", "dead_letters", len(queued))
		w.redriveState.failing = false
	}
	w.done()
	w.notifyCommitted(end, len(bs), func(i int) *sinks.Changes { return &bs[i].changes })
	for i := range bs {
		bs[i].l.moved(bs[i].changes, bs[i].out)
	}
	w.log.Info("redrove dead letters through the partition's worker", "dead_letters", len(queued))
	return nil
}

// redriveState is what the worker remembers of its redrives between
// them, to log each condition once: the projections of queued dead
// letters it does not run, and whether the last redrive failed. Only
// Run's goroutine touches it.
type redriveState struct {
	strangers map[string]bool
	failing   bool
}

// laneOf returns the index of projection name's lane, -1 when the worker
// has none.
func (w *Worker) laneOf(name string) int {
	for i, l := range w.lanes {
		if l.proj.Name == name {
			return i
		}
	}
	return -1
}

// redriveRecord is the record of a queued redrive as the partition's
// records come: its dead letter's record, with sinks.ReplayHeader naming
// the dead letter (in place of one a replayed record carried).
func redriveRecord(tp sinks.TP, r sinks.Redrive) *kgo.Record {
	rec := &kgo.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: r.Offset, Key: r.RecordKey, Value: r.Value, Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		if h.Key != sinks.ReplayHeader {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: sinks.ReplayHeader, Value: []byte(strconv.FormatInt(r.DeadLetter, 10))})
	return rec
}
