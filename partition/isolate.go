package partition

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/sinks"
)

// A batch whose transaction Postgres refuses with a data error the sink
// cannot pin to rows (sinks.ErrRefusedData: a key the state read cannot
// take, a parked event or a dead letter its table cannot hold) fails the
// same way however often it is tried. The worker applies its records
// again in halves, each half in its own transaction and in offset order
// (the first moves the stored offset to its end, the second on from
// there), halving again whatever is refused, until a record is alone: a
// record refused alone is dead-lettered (class refused) with the error,
// and the rest commits. Nothing of this runs unless a transaction was
// refused so: a batch Postgres takes costs what it did before.

// refusal is a record to dead-letter rather than apply: Postgres refused
// the transaction of it alone.
type refusal struct {
	offset int64
	cause  error
	// bare leaves its headers out of the dead letter: Postgres refused
	// the dead letter too.
	bare bool
}

// mark fails the item of the refused record among items.
func (r *refusal) mark(items []*item) {
	for _, it := range items {
		if it.offset != r.offset {
			continue
		}
		it.fail(sinks.ClassRefused, fmt.Errorf("postgres refused the writes of this record alone: %w", r.cause))
		if r.bare {
			it.headers = nil
		}
	}
}

// isolate applies recs, whose transaction Postgres refused with cause
// (sinks.ErrRefusedData), again in halves, each applied as a batch of its
// own (see process), which halves it again should it be refused too. A
// single record refused is dead-lettered.
func (w *Worker) isolate(ctx context.Context, recs []*kgo.Record, cause error) error {
	var live []*kgo.Record // not committed yet, not a transaction marker
	for _, r := range recs {
		if r.Offset >= w.claim.NextOffset && !r.Attrs.IsControl() {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return cause // nothing of it left to blame: not a record's doing
	}
	if len(live) == 1 {
		return w.refuseAlone(ctx, recs, live[0], cause)
	}
	if w.isolating == 0 {
		w.log.Warn("postgres refused the data of a batch; applying its records again in halves to dead-letter those it refuses",
			"from", live[0].Offset, "to", live[len(live)-1].Offset+1, "err", cause)
	}
	w.isolating++
	defer func() { w.isolating-- }()
	half := len(recs) / 2
	for _, part := range [][]*kgo.Record{recs[:half], recs[half:]} {
		if err := w.process(ctx, part); err != nil {
			return err
		}
	}
	return nil
}

// refuseAlone dead-letters rec, the one record of recs not committed,
// whose transaction Postgres refused with cause. Should Postgres refuse
// its dead letter too, it is written without the record's headers; should
// it refuse that, it is tried again with backoff, as a transient failure.
func (w *Worker) refuseAlone(ctx context.Context, recs []*kgo.Record, rec *kgo.Record, cause error) error {
	r := &refusal{offset: rec.Offset, cause: cause}
	w.refusal = r
	defer func() { w.refusal = nil }()
	for attempt := 0; ; attempt++ {
		err := w.process(ctx, recs)
		if !errors.Is(err, sinks.ErrRefusedData) {
			return err
		}
		if !r.bare {
			r.bare = true
			continue
		}
		if err := w.backoffPlanned(ctx, attempt, fmt.Sprintf("dead-letter the record at offset %d", rec.Offset), err); err != nil {
			return err
		}
	}
}
