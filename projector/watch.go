package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/projector-dev/projector/partition"
)

// A member that cannot reach its brokers, consumes a topic that does not
// exist or never joins its group would otherwise run on in silence: the
// Kafka client retries for ever, and "projector running" is the last line
// in the log. The engine watches for each of these, says which it is in a
// WARN line (repeated at most once a minute while it lasts, with an INFO
// line when it is over) and in /readyz's "kafka" check. It also logs, per
// projection, one line of progress every ProgressEvery when anything
// moved.

// watchTimes are the watch's intervals; tests shorten them.
type watchTimes struct {
	// every is how often the watch looks.
	every time.Duration
	// joinWarn is how long a member may be out of its group before it
	// says so: longer than a healthy join takes.
	joinWarn time.Duration
	// repeat is how often a lasting problem is logged again.
	repeat time.Duration
	// progress is how often progress is logged (0: never).
	progress time.Duration
	// request bounds each probe (a ping, a topic listing).
	request time.Duration
	// unowned is how often the partitions no member runs, and the halted
	// ones, are looked at for their lag (see unowned.go).
	unowned time.Duration
}

var defaultWatchTimes = watchTimes{
	every:    time.Second,
	joinWarn: 10 * time.Second,
	repeat:   time.Minute,
	progress: DefaultProgressEvery,
	request:  5 * time.Second,
	unowned:  15 * time.Second,
}

// with returns t logging progress every progress (negative: never).
func (t watchTimes) with(progress time.Duration) watchTimes {
	t.progress = max(progress, 0)
	return t
}

// DefaultProgressEvery is how often the engine logs each projection's
// progress unless Config.ProgressEvery says otherwise.
const DefaultProgressEvery = 30 * time.Second

// kafkaWatch holds what the watch last found (under mu).
type kafkaWatch struct {
	mu      sync.Mutex
	problem error // nil: joined, topics present
	// said is when each problem was last logged, by its kind.
	said map[string]time.Time
}

func (k *kafkaWatch) current() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.problem
}

// watchKafka looks at the member's standing with Kafka every
// watchTimes.every until ctx ends.
func (e *Engine) watchKafka(ctx context.Context) {
	t := time.NewTicker(e.watch.every)
	defer t.Stop()
	started := e.now()
	var lastTopics time.Time
	var missing []string
	prog := newProgress(e)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := e.now()
		joined := inGroup(e.cl)
		// Topics are listed while out of the group (why is it out?), while
		// one is missing (is it there now?) and every repeat interval
		// otherwise: a missing topic does not keep a member out of its
		// group, it only leaves it without partitions.
		var problem error
		var kind string
		if !joined && now.Sub(started) >= e.watch.joinWarn {
			switch err := e.ping(ctx); {
			case errors.Is(err, kerr.SaslAuthenticationFailed):
				// The brokers answer: saying none does would send the
				// operator to the network instead of the credentials.
				problem, kind = fmt.Errorf("the Kafka brokers refuse this member's SASL credentials (seed brokers %s): check the SASL mechanism, user name and password: %w", strings.Join(e.cfg.Brokers, ","), err), "brokers"
			case err != nil:
				problem, kind = fmt.Errorf("no Kafka broker answers (seed brokers %s): %w", strings.Join(e.cfg.Brokers, ","), err), "brokers"
			}
		}
		if problem == nil && (!joined && now.Sub(started) >= e.watch.joinWarn || len(missing) > 0 || now.Sub(lastTopics) >= e.watch.repeat) {
			if m, err := e.missingTopics(ctx); err == nil {
				missing, lastTopics = m, now
			}
		}
		switch {
		case problem != nil:
		case len(missing) > 0:
			problem, kind = fmt.Errorf("topic %s does not exist: create it, or correct the projection's topic", strings.Join(missing, ", ")), "topics"
		case !joined && now.Sub(started) >= e.watch.joinWarn:
			problem, kind = fmt.Errorf("not joined to consumer group %q after %s: the brokers answer; check the group's authorization and the brokers' logs",
				e.cfg.Identity, now.Sub(started).Round(time.Second)), "group"
		}
		if joined {
			started = now // a member that leaves the group later is given joinWarn again
		}
		e.noteKafka(now, problem, kind)
		prog.tick(now)
		e.drain.sample(now, e.Workers())
	}
}

// noteKafka records the watch's finding and logs it when it is new, has
// lasted another repeat interval, or is over.
func (e *Engine) noteKafka(now time.Time, problem error, kind string) {
	k := &e.kafka
	k.mu.Lock()
	prev := k.problem
	k.problem = problem
	say := false
	if problem != nil {
		if last, ok := k.said[kind]; !ok || now.Sub(last) >= e.watch.repeat || prev == nil {
			k.said[kind] = now
			say = true
		}
	} else if prev != nil {
		clear(k.said)
	}
	k.mu.Unlock()
	switch {
	case say:
		e.log.Warn(problem.Error(), "problem", kind)
	case problem == nil && prev != nil:
		e.log.Info("Kafka problem over: joined to the consumer group and every topic exists")
	}
}

func (e *Engine) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.watch.request)
	defer cancel()
	return e.cl.Ping(ctx)
}

// missingTopics lists the projections' topics the cluster does not have.
func (e *Engine) missingTopics(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, e.watch.request)
	defer cancel()
	topics := make([]string, 0, len(e.byTopic))
	for t := range e.byTopic {
		topics = append(topics, t)
	}
	details, err := e.adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, t := range topics {
		d, ok := details[t]
		if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			missing = append(missing, t)
		}
	}
	slices.Sort(missing)
	return missing, nil
}

// progress logs each projection's progress since its last line.
type progress struct {
	e    *Engine
	last time.Time
	// seen are the totals of each partition at the last line.
	seen map[string]progressTotals // by topic/partition
	lag  map[string]int64          // by projection, at the last line
}

type progressTotals struct{ applied, stale, dead int64 }

func newProgress(e *Engine) *progress {
	return &progress{e: e, last: e.now(), seen: map[string]progressTotals{}, lag: map[string]int64{}}
}

func (p *progress) tick(now time.Time) {
	if p.e.watch.progress <= 0 || now.Sub(p.last) < p.e.watch.progress {
		return
	}
	p.last = now
	type sum struct {
		applied, stale, dead, lag int64
		parked, partitions        int
	}
	by := map[string]*sum{}
	seen := map[string]progressTotals{}
	for _, s := range p.e.Workers() {
		// The partition's projection, and the others of its topic (each
		// with the partition's lag).
		lanes := append([]partition.LaneStatus{{Projection: s.Projection, Parked: s.Parked,
			Applied: s.Applied, Stale: s.Stale, DeadLettered: s.DeadLettered}}, s.Others...)
		for _, l := range lanes {
			name := l.Projection
			if by[name] == nil {
				by[name] = &sum{}
			}
			b := by[name]
			id := fmt.Sprintf("%s/%s/%d", name, s.Topic, s.Partition)
			t := progressTotals{applied: l.Applied, stale: l.Stale, dead: l.DeadLettered}
			was := p.seen[id]
			if t.applied < was.applied || t.stale < was.stale || t.dead < was.dead {
				was = progressTotals{} // a new worker for the partition
			}
			b.applied += t.applied - was.applied
			b.stale += t.stale - was.stale
			b.dead += t.dead - was.dead
			seen[id] = t
			if s.HighWatermark >= 0 {
				b.lag += max(s.HighWatermark-s.NextOffset, 0)
			}
			b.parked += l.Parked
			b.partitions++
		}
	}
	p.seen = seen
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	slices.Sort(names)
	lag := map[string]int64{}
	for _, n := range names {
		b := by[n]
		lag[n] = b.lag
		if b.applied == 0 && b.stale == 0 && b.dead == 0 && b.lag == p.lag[n] {
			continue
		}
		p.e.log.LogAttrs(context.Background(), slog.LevelInfo, "progress",
			slog.String("projection", n), slog.Int64("applied", b.applied), slog.Int64("stale", b.stale),
			slog.Int64("dead_lettered", b.dead), slog.Int("parked", b.parked), slog.Int64("lag", b.lag),
			slog.Int("partitions", b.partitions), slog.Duration("over", p.e.watch.progress))
	}
	p.lag = lag
}
