package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
)

// EndOffsets lists the log-end offset of every partition of topic.
func EndOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	res, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	out := map[int32]int64{}
	var firstErr error
	res.Each(func(o kadm.ListedOffset) {
		if o.Err != nil && firstErr == nil {
			firstErr = o.Err
		}
		out[o.Partition] = o.Offset
	})
	if firstErr != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", topic, firstErr)
	}
	return out, nil
}

// Committed sums the stored next offsets of identity on topic and reports
// whether every partition has reached its end offset.
func Committed(ctx context.Context, pool *pgxpool.Pool, identity, topic string, end map[int32]int64) (int64, bool, error) {
	rows, err := pool.Query(ctx, `SELECT partition, coalesce(next_offset, 0) FROM projector_offsets WHERE identity = $1 AND topic = $2`, identity, topic)
	if err != nil {
		return 0, false, fmt.Errorf("read stored offsets: %w", err)
	}
	defer rows.Close()
	stored := map[int32]int64{}
	var sum int64
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return 0, false, fmt.Errorf("read stored offsets: %w", err)
		}
		stored[p] = n
		sum += n
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("read stored offsets: %w", err)
	}
	done := true
	for p, e := range end {
		if stored[p] < e {
			done = false
		}
	}
	return sum, done, nil
}

// WaitCommitted polls until identity has committed every partition up to
// end, or until ctx ends. tick, if not nil, is called with the committed
// record count after each poll.
func WaitCommitted(ctx context.Context, pool *pgxpool.Pool, identity, topic string, end map[int32]int64, tick func(committed int64)) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		n, done, err := Committed(ctx, pool, identity, topic, end)
		if err == nil && tick != nil {
			tick(n)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to commit %s: %w (last error: %v)", identity, topic, ctx.Err(), err)
		case <-t.C:
		}
	}
}
