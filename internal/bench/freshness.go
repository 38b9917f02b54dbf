package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
)

// Freshness is the result of the freshness run: how long after its
// record timestamp an event is visible in the fold projection's table,
// at a steady arrival rate below the engine's maximum.
type Freshness struct {
	// Load is the arrival rate as a fraction of the fold engine's
	// measured events/s: TargetRate is that much of it.
	Load         float64 `json:"load"`
	TargetRate   float64 `json:"target_events_per_sec"`
	ProducedRate float64 `json:"produced_events_per_sec"`
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	P50MS        float64 `json:"p50_ms"`
	P90MS        float64 `json:"p90_ms"`
	P99MS        float64 `json:"p99_ms"`
	MaxMS        float64 `json:"max_ms"`
	Batches      int     `json:"batches"`
	GoCPUSeconds float64 `json:"go_cpu_seconds"`
	// PGCPUSeconds is the CPU of the Postgres backends serving the engine,
	// nil when their /proc entries are not readable; ProducerCPUSeconds
	// that of this process, which produces the stream (and runs the
	// embedded broker and registry, when they are): all three over
	// WindowSeconds, the engine's run, group join and drain included. On
	// a machine of few cores the producer's share is CPU the engine did
	// not have.
	PGCPUSeconds       *float64 `json:"pg_cpu_seconds,omitempty"`
	ProducerCPUSeconds float64  `json:"producer_cpu_seconds"`
	WindowSeconds      float64  `json:"window_seconds"`
	Check              string   `json:"check"`
	// Rebuild is the rebuild that ran beside the live generation
	// (rebuild-freshness; nil: none did). Its engine's CPU is in
	// GoCPUSeconds: it runs in the same process, as in projector run.
	Rebuild *RebuildResult `json:"rebuild,omitempty"`
}

// runFreshness starts an engine (fold) on an empty topic, and once it runs
// produces a new stream to it at rate events/s, each record stamped with
// the time it is handed to the producer (the record timestamp, kept at
// nanosecond precision on this side). The engine child notes when the
// COMMIT of every batch returned and which offsets it covered; an event's
// freshness is that commit time minus its timestamp. i numbers the run
// among those of one bench (a stream, topic and profile of its own); load
// is rate as a fraction of the fold engine's events/s.
func (b *bench) runFreshness(ctx context.Context, main *dataset, i int, load, rate float64) (*Freshness, error) {
	cfg := b.cfg
	n := max(1, int(math.Round(rate*cfg.FreshFor.Seconds())))
	// The stream spreads over the aggregates of the main one, as a live
	// system's events fall on one population of aggregates whatever their
	// rate, so that runs at several rates differ only in the rate.
	aggs := cfg.Aggregates[0]
	ds := &dataset{opts: GenOptions{Events: n, Aggregates: aggs, Skew: cfg.Skew, CloseEvery: DefaultCloseEvery, Seed: cfg.Seed + 1000 + uint64(i)}}
	var err error
	if ds.records, err = Generate(ds.opts); err != nil {
		return nil, err
	}
	ds.exp, ds.events = demo.Fold(ds.records), len(ds.records)
	name := "fresh"
	if i > 0 {
		name = fmt.Sprintf("fresh-%d", i)
	}
	if ds.topic, err = b.topic(ctx, name); err != nil {
		return nil, err
	}
	values := make([][]byte, n)
	for i, r := range ds.records {
		values[i] = AppendValue(nil, b.schemaID, r.Event, cfg.ValueBytes)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return nil, err
	}
	defer prod.Close()
	stamp := make([]int64, n)
	ds.partOf = make([]int32, n)
	ds.offOf = make([]int64, n)
	fr := &Freshness{Load: load, TargetRate: rate, Events: n}

	during := func(ctx context.Context, started <-chan struct{}, send func(command) error) error {
		// Wait until the engine runs a worker for every partition, so
		// that joining the group does not count as latency.
		select {
		case <-started:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("the engine did not start a worker for every partition of %s within 2 minutes", ds.topic)
		}
		secs, err := producePaced(ctx, prod, ds, values, stamp, 0, n, rate)
		if err != nil {
			return err
		}
		fr.Seconds = secs
		fr.ProducedRate = float64(n) / fr.Seconds
		end, err := demo.EndOffsets(ctx, b.adm, ds.topic)
		if err != nil {
			return err
		}
		ds.end = end
		return send(command{Cmd: "end", End: end})
	}
	spec := WorkerSpec{
		Mode: ModeEngineFold, Topic: ds.topic, Partitions: cfg.Partitions,
		BatchMaxRecords: cfg.BatchMaxRecords, BatchMaxWait: cfg.BatchMaxWait, CommitMaxBatches: cfg.CommitMaxBatches,
		StateCacheRows:  cfg.StateCacheRows,
		StateCacheBytes: cfg.StateCacheBytes, MemberMaxRecords: cfg.MemberMaxRecords, CommitLog: true,
	}
	if cfg.ProfileDir != "" {
		spec.CPUProfile = filepath.Join(cfg.ProfileDir, ModeFreshness+".pprof")
		if i > 0 {
			spec.CPUProfile = filepath.Join(cfg.ProfileDir, fmt.Sprintf("%s-%d.pprof", ModeFreshness, i))
		}
	}
	s, err := b.runChild(ctx, spec, during, func(ctx context.Context, pool *pgxpool.Pool, _ *WorkerResult) error {
		if err := demo.Verify(ctx, pool, demo.Table, ds.exp); err != nil {
			return err
		}
		return checkEngineTables(ctx, pool)
	})
	if err != nil {
		return nil, err
	}
	fr.Check = "ok"
	if s.Check != nil {
		fr.Check = "FAILED: " + s.Check.Error()
	}
	fr.GoCPUSeconds, fr.PGCPUSeconds = s.Result.CPUSeconds, s.PGCPU
	fr.ProducerCPUSeconds, fr.WindowSeconds = s.ParentCPU, s.Result.Seconds
	fr.Batches = len(s.Result.Commits)
	lat, err := latencies(s.Result.Commits, ds.partOf, ds.offOf, stamp)
	if err != nil {
		return nil, err
	}
	fr.P50MS, fr.P90MS, fr.P99MS, fr.MaxMS = pct(lat, 0.50), pct(lat, 0.90), pct(lat, 0.99), pct(lat, 1)
	return fr, nil
}

// producePaced produces ds.records[from:from+n] to ds.topic at rate
// events/s, each stamped with the time it is handed to the producer
// (values[i] and stamp[i] are of record from+i), noting where each
// landed; it returns how long producing took.
func producePaced(ctx context.Context, prod *kgo.Client, ds *dataset, values [][]byte, stamp []int64, from, n int, rate float64) (float64, error) {
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < n; {
		due := min(n, int(time.Since(start).Seconds()*rate)+1)
		for ; i < due; i++ {
			idx := from + i
			rec := &kgo.Record{Topic: ds.topic, Key: []byte(ds.records[idx].Key), Value: values[i]}
			now := time.Now()
			rec.Timestamp = now
			stamp[i] = now.UnixNano()
			wg.Add(1)
			prod.Produce(ctx, rec, func(r *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				ds.partOf[idx], ds.offOf[idx] = r.Partition, r.Offset
			})
		}
		if i < n {
			select {
			case <-tick.C:
			case <-ctx.Done():
				wg.Wait()
				return 0, ctx.Err()
			}
		}
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("produce: %w", firstErr)
	}
	return time.Since(start).Seconds(), nil
}

// latencies maps every produced record to the commit that covered its
// offset and returns commit time minus record timestamp, in milliseconds.
func latencies(commits []Commit, partOf []int32, offOf []int64, stamp []int64) ([]float64, error) {
	byPart := map[int32][]Commit{}
	for _, c := range commits {
		byPart[c.Partition] = append(byPart[c.Partition], c)
	}
	for _, cs := range byPart {
		slices.SortFunc(cs, func(a, b Commit) int { return int(a.From - b.From) })
	}
	out := make([]float64, 0, len(stamp))
	for i := range stamp {
		cs := byPart[partOf[i]]
		j := sort.Search(len(cs), func(j int) bool { return cs[j].To > offOf[i] })
		if j == len(cs) || cs[j].From > offOf[i] {
			return nil, fmt.Errorf("no commit covers partition %d offset %d", partOf[i], offOf[i])
		}
		out = append(out, float64(cs[j].At-stamp[i])/1e6)
	}
	slices.Sort(out)
	return out, nil
}

// pct is the q-quantile of sorted values (nearest rank).
func pct(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
