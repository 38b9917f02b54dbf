package freshness

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// stalenessSQL reads each partition of the projection's topic as the
// engine stored it: when it last saw the partition caught up (a commit
// that reached the high watermark it knew, or the mark it leaves on an
// idle partition), against the database's clock. A rebuilt projection's
// offsets are its live generation's group's.
const (
	stalenessSQL = `SELECT o.partition, extract(epoch FROM now() - coalesce(o.caught_up_at, o.updated_at))::float8
	FROM projector_offsets o
	WHERE o.identity = $1 AND o.topic = $2 AND $3::text IS NOT NULL`
	stalenessGenerationsSQL = `SELECT o.partition, extract(epoch FROM now() - coalesce(o.caught_up_at, o.updated_at))::float8
	FROM projector_offsets o
	WHERE o.identity = coalesce((SELECT g.group_id FROM projector_generations g
			WHERE g.identity = $1 AND g.projection = $3 AND g.state = 'live'), $1)
	  AND o.topic = $2`
)

// Staleness is how far behind the partition that owns key is; 0 when
// caught up. It is the time since the engine last saw that partition
// caught up, less Config.Tolerance, and never below 0: a partition the
// engine has not reached the end of for a minute is a minute (less the
// tolerance) stale, and so is one whose engine stopped a minute ago.
// The owning partition is the one Kafka's default partitioner gives the
// key among the partitions stored for the topic; when that cannot be
// known (the stored partitions are not 0 to n-1, or
// Config.OtherPartitioner says the producers partition otherwise), it is
// the topic's stalest, as it is for key "". A topic of which nothing is
// stored yet is an error. The offsets are read at most once every
// Config.StalenessCache for each projection, so the figure may be that
// much older than the call.
func (w *Watcher) Staleness(ctx context.Context, projection, key string) (time.Duration, error) {
	p := w.projs[projection]
	if p == nil {
		return 0, fmt.Errorf("staleness of %s/%s: %w", projection, key, ErrUnknownProjection)
	}
	ages, err := w.partitionAges(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("staleness of %s/%s: %w", projection, key, err)
	}
	if len(ages.ages) == 0 {
		if len(ages.others) > 0 {
			return 0, fmt.Errorf("staleness of %s/%s: no offsets of topic %s are stored under identity %q, only under %s: is that the engine's identity?",
				projection, key, p.p.Topic, w.cfg.Identity, quoted(ages.others))
		}
		return 0, fmt.Errorf("staleness of %s/%s: no offsets of topic %s are stored (identity %q): the engine has not run", projection, key, p.p.Topic, w.cfg.Identity)
	}
	worst, top := ages.worst, ages.top
	a := worst
	if key != "" && int(top)+1 == len(ages.ages) && !w.cfg.OtherPartitioner[projection] {
		a = ages.ages[PartitionOf(key, len(ages.ages))]
	}
	d := time.Duration(a*float64(time.Second)) - w.cfg.Tolerance
	return max(d, 0), nil
}

// ages is a read of a topic's partitions' ages: seconds since the
// engine last saw each caught up.
type ages struct {
	ages  map[int32]float64
	worst float64 // the oldest
	top   int32   // the highest partition stored
	read  time.Time
	// others, when nothing is stored under the identity, are identities
	// that store offsets of the topic: most likely the one the engine
	// runs as.
	others []string
}

// partitionAges reads the ages of p's topic's partitions, or answers the
// last read when it is less than Config.StalenessCache old: a read by key
// would otherwise add a second statement, reading every partition's
// offset, to each one, for a figure that moves by the second.
func (w *Watcher) partitionAges(ctx context.Context, p *watched) (*ages, error) {
	if w.cfg.StalenessCache > 0 {
		if a := p.ages.Load(); a != nil && time.Since(a.read) < w.cfg.StalenessCache {
			return a, nil
		}
		// One reader a projection: the requests that find the read too
		// old at once wait for it rather than each running it.
		p.agesMu.Lock()
		defer p.agesMu.Unlock()
		if a := p.ages.Load(); a != nil && time.Since(a.read) < w.cfg.StalenessCache {
			return a, nil
		}
	}
	gens, err := w.generations(ctx)
	if err != nil {
		return nil, err
	}
	query := stalenessSQL
	if gens {
		query = stalenessGenerationsSQL
	}
	read := time.Now()
	rows, err := w.pool.Query(ctx, query, w.cfg.Identity, p.p.Topic, p.p.Name)
	if err != nil {
		return nil, err
	}
	a := &ages{ages: map[int32]float64{}, read: read}
	var (
		part int32
		age  float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&part, &age}, func() error {
		a.ages[part] = age
		a.worst = max(a.worst, age)
		a.top = max(a.top, part)
		return nil
	}); err != nil {
		return nil, err
	}
	if len(a.ages) == 0 {
		if a.others, err = w.othersStoring(ctx, p.p.Topic); err != nil {
			return nil, err
		}
	}
	p.ages.Store(a)
	return a, nil
}

// othersStoring lists a few identities that store offsets of topic.
func (w *Watcher) othersStoring(ctx context.Context, topic string) ([]string, error) {
	rows, err := w.pool.Query(ctx, `SELECT DISTINCT identity FROM projector_offsets WHERE topic = $1 ORDER BY identity LIMIT 5`, topic)
	if err != nil {
		return nil, fmt.Errorf("read the identities storing offsets of %s: %w", topic, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the identities storing offsets of %s: %w", topic, err)
	}
	return ids, nil
}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

// generationsEvery is how often the watcher looks whether projections
// have generations until they have.
const generationsEvery = 10 * time.Second

// generations says whether the table of projections' generations
// exists: it does once any projection was rebuilt, and is never dropped.
func (w *Watcher) generations(ctx context.Context) (bool, error) {
	if w.gens.Load() {
		return true, nil
	}
	// Looked for again at most every generationsEvery, so that a round
	// stays one statement.
	now := time.Now().UnixNano()
	if last := w.gensChecked.Load(); last != 0 && now-last < int64(generationsEvery) {
		return false, nil
	}
	w.gensChecked.Store(now)
	var ok bool
	if err := w.pool.QueryRow(ctx, `SELECT to_regclass('projector_generations') IS NOT NULL`).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for projections' generations: %w", err)
	}
	if ok {
		w.gens.Store(true)
	}
	return ok, nil
}
