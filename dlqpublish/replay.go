package dlqpublish

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/sinks"
)

// markTimeout bounds the bookkeeping done after the broker acknowledged a
// record, which runs even when the caller's context has just ended.
const markTimeout = 10 * time.Second

// ReplayRecord is the record Replay produces for d: its original topic,
// key, value and headers, byte for byte, with sinks.ReplayHeader set to d's id
// (replacing an sinks.ReplayHeader already there, as a record replayed before
// carries one), and Partition set to the original partition.
func ReplayRecord(d deadletters.Entry) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(d.Headers)+1)
	for _, h := range d.Headers {
		if h.Key != sinks.ReplayHeader {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	headers = append(headers, kgo.RecordHeader{Key: sinks.ReplayHeader, Value: []byte(strconv.FormatInt(d.ID, 10))})
	return &kgo.Record{
		Topic:     d.Topic,
		Partition: d.Partition,
		Key:       d.RecordKey(),
		Value:     d.Value,
		Headers:   headers,
	}
}

// Replay produces each entry again to its original topic (see
// ReplayRecord), one at a time, at most perSecond per second (no limit
// when perSecond is not positive), waiting for the broker's
// acknowledgement of each and then marking it replayed
// (deadletters.MarkReplayed). It returns how many it produced; on an error
// the entries before it are produced and marked, the rest untouched.
//
// The record's partition is decided by cl's partitioner: give Replay a
// client built with kgo.RecordPartitioner(kgo.ManualPartitioner()) to
// keep each record on its original partition (so the same worker sees
// the aggregate's events); with the default partitioner the key's hash
// decides.
//
// Replay refuses, before producing anything, when an entry has status
// purged.
func Replay(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client, entries []deadletters.Entry, perSecond float64) (int, error) {
	for _, d := range entries {
		if d.Status == deadletters.StatusPurged {
			return 0, fmt.Errorf("dead letter %d is purged: refusing to replay it", d.ID)
		}
	}
	limit := rate.Inf
	if perSecond > 0 {
		limit = rate.Limit(perSecond)
	}
	lim := rate.NewLimiter(limit, 1)
	n := 0
	for _, d := range entries {
		if err := lim.Wait(ctx); err != nil {
			return n, fmt.Errorf("replay: %d of %d produced: %w", n, len(entries), err)
		}
		// Marked before the record goes out: the engine may apply it (and
		// resolve the entry) or fail it again (and reopen the entry)
		// before a mark made after the broker's acknowledgement would
		// land, which would then hide what the replay did.
		if err := deadletters.MarkReplayed(ctx, pool, []int64{d.ID}); err != nil {
			return n, fmt.Errorf("replay dead letter %d: nothing produced: %w", d.ID, err)
		}
		if err := cl.ProduceSync(ctx, ReplayRecord(d)).FirstErr(); err != nil {
			// Not out: the entry is as it was, even if ctx ended meanwhile.
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
			uerr := deadletters.UnmarkReplayed(mctx, pool, d.ID, d.Status)
			cancel()
			if uerr != nil {
				err = fmt.Errorf("%w (and marking it as before failed: %w)", err, uerr)
			}
			return n, fmt.Errorf("replay dead letter %d to %s: %d of %d produced: %w", d.ID, d.Topic, n, len(entries), err)
		}
		n++
	}
	return n, nil
}
