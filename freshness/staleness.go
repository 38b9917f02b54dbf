package freshness

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// stalenessSQL reads each partition of the projection's topic as the
// engine stored it: when it last saw the partition caught up (a commit
// that reached the high watermark it knew, or the mark it leaves on an
// idle partition), against the database's clock. A rebuilt projection's
// offsets are its live generation's group's.
const stalenessSQL = `SELECT o.partition, extract(epoch FROM now() - coalesce(o.caught_up_at, o.updated_at))::float8
	FROM projector_offsets o
	WHERE o.identity = CASE WHEN to_regclass('projector_generations') IS NULL THEN $1
		ELSE coalesce((SELECT g.group_id FROM projector_generations g
			WHERE g.identity = $1 AND g.projection = $3 AND g.state = 'live'), $1) END
	  AND o.topic = $2`

// Staleness is how far behind the partition that owns key is; 0 when
// caught up. It is the time since the engine last saw that partition
// caught up, less Config.Tolerance, and never below 0: a partition the
// engine has not reached the end of for a minute is a minute (less the
// tolerance) stale, and so is one whose engine stopped a minute ago.
// The owning partition is the one Kafka's default partitioner gives the
// key among the partitions stored for the topic; when that cannot be
// known (the stored partitions are not 0 to n-1), it is the topic's
// stalest. A topic of which nothing is stored yet is an error.
func (w *Watcher) Staleness(ctx context.Context, projection, key string) (time.Duration, error) {
	p := w.projs[projection]
	if p == nil {
		return 0, fmt.Errorf("staleness of %s/%s: %w", projection, key, ErrUnknownProjection)
	}
	rows, err := w.pool.Query(ctx, stalenessSQL, w.cfg.Identity, p.p.Topic, p.p.Name)
	if err != nil {
		return 0, fmt.Errorf("staleness of %s/%s: %w", projection, key, err)
	}
	ages := map[int32]float64{}
	var (
		part  int32
		age   float64
		worst float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&part, &age}, func() error {
		ages[part] = age
		worst = max(worst, age)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("staleness of %s/%s: %w", projection, key, err)
	}
	if len(ages) == 0 {
		return 0, fmt.Errorf("staleness of %s/%s: no offsets are stored for topic %s (identity %s): the engine has not run", projection, key, p.p.Topic, w.cfg.Identity)
	}
	a, ok := ages[PartitionOf(key, len(ages))]
	if !ok {
		a = worst
	}
	d := time.Duration(a*float64(time.Second)) - w.cfg.Tolerance
	return max(d, 0), nil
}
