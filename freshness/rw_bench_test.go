package freshness_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/demo"
)

// BenchmarkReadYourWrites measures what read-your-writes costs the
// engine and what it gives a reader:
//
//   - the engine's events/s folding a produced backlog, in alternating
//     windows of one second: in half of them 1,000 reads wait all
//     along, each for the last version of an account the engine is
//     writing (a new one as soon as it is reached), in the other half
//     none does. The windows come in pairs, one of each, in the order
//     with-without, without-with, without-with, with-without... so that
//     a fold slowing as its table grows favours neither side; a pair's
//     two windows see the same table, broker and machine, which
//     separate runs of the engine on a shared machine do not;
//   - the latency of read-after-write at 10% load: from a service's
//     outbox transaction beginning to the read waiting for the version
//     it wrote returning, through the relay, Kafka and the engine, at a
//     tenth of the writes/s that path carries flat out (measured first).
//
// It runs on the embedded broker unless PROJECTOR_TEST_KAFKA_BROKERS
// names a real cluster: go test -run '^$' -bench ReadYourWrites
// -benchtime 1x ./freshness
func BenchmarkReadYourWrites(b *testing.B) {
	// -short (make test's pass over every benchmark) runs each part
	// small: it shows the benchmark works, not its figures.
	aggregates, meanEvents, window, flatOut, loaded := 100_000, 100, time.Second, 10*time.Second, 20*time.Second
	if testing.Short() {
		aggregates, meanEvents, window, flatOut, loaded = 20_000, 80, 100*time.Millisecond, 2*time.Second, 2*time.Second
	}
	b.Run("engine/waiters=1000", func(b *testing.B) {
		w := engineWindows(b, 1000, aggregates, meanEvents, window)
		if len(w.pairs) == 0 {
			b.Fatal("the fold ended before a pair of windows")
		}
		var ratios []float64
		for _, p := range w.pairs {
			ratios = append(ratios, p.with/p.without)
		}
		with, without := w.with.eps(), w.without.eps()
		b.ReportMetric(without, "events/s-without")
		b.ReportMetric(with, "events/s-with")
		b.ReportMetric(100*with/without, "%-of-without")
		b.ReportMetric(100*median(ratios), "median-pair-%")
		b.Logf("engine events/s in %d pairs of %v windows: without waiters %.0f, with 1,000 waiters %.0f: %.1f%% (median pair %.1f%%, pairs %s)",
			len(w.pairs), window, without, with, 100*with/without, 100*median(ratios), percents(ratios))
		if w.without.pg > 0 && w.with.pg > 0 {
			b.ReportMetric(w.with.cpuPerEvent()/w.without.cpuPerEvent()*100, "%-cpu-per-event")
			b.Logf("CPU per event committed (this process + Postgres): without waiters %.2f µs (%.2f + %.2f), with %.2f µs (%.2f + %.2f): %.1f%%; "+
				"the watcher's Postgres sessions used %.1f%% of a core while reads waited",
				w.without.cpuPerEvent(), w.without.proc.Seconds()*1e6/w.without.events, w.without.pg.Seconds()*1e6/w.without.events,
				w.with.cpuPerEvent(), w.with.proc.Seconds()*1e6/w.with.events, w.with.pg.Seconds()*1e6/w.with.events,
				100*w.with.cpuPerEvent()/w.without.cpuPerEvent(), 100*w.watcher.Seconds()/w.with.took.Seconds())
		}
		if w.with.proc > 0 && w.with.pg > 0 {
			// What the watcher and the reads took of the CPU the
			// machine spent while they waited: the most the engine
			// can lose to them when the CPU is what bounds it.
			spent := w.labelled["watcher"] + w.labelled["reads"] + w.watcher
			b.ReportMetric(100*spent.Seconds()/(w.with.proc+w.with.pg).Seconds(), "%-cpu-to-waits")
			b.Logf("while reads waited, the watcher took %v of this process's CPU, the waiting reads %v, the watcher's Postgres sessions %v: "+
				"%.1f%% of the %v this process and Postgres spent",
				w.labelled["watcher"].Round(time.Millisecond), w.labelled["reads"].Round(time.Millisecond), w.watcher.Round(time.Millisecond),
				100*spent.Seconds()/(w.with.proc+w.with.pg).Seconds(), (w.with.proc + w.with.pg).Round(time.Millisecond))
		}
	})
	// A write is a transaction of its own: the path from the outbox to
	// the read carries far fewer than the engine folds from a backlog.
	// Its 10% load is a tenth of what it carries flat out.
	var full latencies
	b.Run("read-after-write/flat-out", func(b *testing.B) {
		full = readAfterWrite(b, 0, flatOut)
		b.ReportMetric(full.rate, "writes/s")
		b.ReportMetric(full.p50, "p50-ms")
		b.ReportMetric(full.p99, "p99-ms")
	})
	if full.rate == 0 {
		return
	}
	b.Run("read-after-write/load=10%", func(b *testing.B) {
		lat := readAfterWrite(b, full.rate/10, loaded)
		b.ReportMetric(lat.rate, "writes/s")
		b.ReportMetric(lat.p50, "p50-ms")
		b.ReportMetric(lat.p99, "p99-ms")
		b.Logf("read-after-write at %.0f writes/s (10%% of %.0f): p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d writes",
			lat.rate, full.rate, lat.p50, lat.p99, lat.max, lat.n)
	})
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func percents(xs []float64) string {
	var sb strings.Builder
	for i, x := range xs {
		if i > 0 {
			sb.WriteString(" ")
		}
		fmt.Fprintf(&sb, "%.0f%%", 100*x)
	}
	return sb.String()
}

// pair is the engine's events/s in two neighbouring windows of a fold,
// with reads waiting in one and none in the other.
type pair struct{ with, without float64 }

// engineWindows folds a produced stream of aggregates accounts with
// reads waiting for their last versions in every other window, and
// returns the events/s of each whole pair of windows.
func engineWindows(b *testing.B, waiters, aggregates, meanEvents int, window time.Duration) windows {
	ctx := b.Context()
	pl := newPipeline(b, 3, freshness.Config{})
	records := demo.Generate(demo.Options{Aggregates: aggregates, MeanEvents: meanEvents, Seed: 7})
	last := map[string]int64{}
	for _, r := range records {
		last[r.Key] = max(last[r.Key], r.Event.Version)
	}
	keys := make([]string, 0, len(last))
	for k := range last {
		keys = append(keys, k)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(pl.kafka.Addrs()...))
	if err != nil {
		b.Fatal(err)
	}
	defer prod.Close()
	if err := demo.Produce(ctx, prod, pl.enc, records, nil); err != nil {
		b.Fatal(err)
	}
	end, err := demo.EndOffsets(ctx, kadm.NewClient(prod), pl.kafka.Topic)
	if err != nil {
		b.Fatal(err)
	}
	records = nil
	committed := func() (int64, bool) {
		n, done, err := demo.Committed(ctx, pl.db.Pool, identity, pl.kafka.Topic, end)
		if err != nil {
			b.Fatal(err)
		}
		return n, done
	}
	var reached atomic.Int64
	// wait starts the waiters, and returns what stops them.
	wait := func() (stop func()) {
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range waiters {
			wg.Go(func() {
				pprof.Do(wctx, pprof.Labels(costLabel, "reads"), func(wctx context.Context) {
					rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
					for wctx.Err() == nil {
						k := keys[rng.IntN(len(keys))]
						r, err := pl.w.WaitVersion(wctx, "accounts", k, "", last[k], 5*time.Second)
						if err != nil && !errors.Is(err, context.Canceled) {
							b.Error(err)
							return
						}
						if r.Reached {
							reached.Add(1)
						}
					}
				})
			})
		}
		waitFor(b, func() bool { return pl.w.Waiting() >= waiters*9/10 })
		return func() {
			cancel()
			wg.Wait()
		}
	}

	pl.engine(b)
	// The group's join is no window's.
	waitFor(b, func() bool { n, _ := committed(); return n > 0 })
	// The stored offsets move a transaction at a time, tens of
	// thousands of events at once while the engine catches up: read
	// every few milliseconds, they tell when each transaction
	// committed, and a window's events are counted between the
	// commits around its ends, in proportion to the time.
	var (
		trace   commits
		stopped = make(chan struct{})
		traced  = make(chan struct{})
	)
	go func() {
		defer close(traced)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			n, one, done := progress(ctx, b, pl.db.Pool, end)
			trace.add(time.Now(), n)
			if one && trace.oneDone.IsZero() {
				trace.oneDone = time.Now()
			}
			if done {
				return
			}
			select {
			case <-stopped:
				return
			case <-tick.C:
			}
		}
	}()
	type span struct {
		with       bool
		began, end time.Time
		proc, pg   time.Duration // the CPU this process and Postgres's sessions used
		watcher    time.Duration // of pg, the watcher's sessions'
		labelled   map[string]time.Duration
	}
	var spans []span
	rounds0, busy0 := pl.polls.n.Load(), pl.polls.nanos.Load()
	for i := 0; ; i++ {
		with := i%4 == 0 || i%4 == 3
		stop := func() {}
		if with {
			stop = wait()
		}
		// Every window is profiled, so that the profiler's cost falls on
		// both sides alike: the profile tells the watcher's and the
		// waiting reads' part of this process's CPU (their goroutines
		// carry costLabel).
		var prof bytes.Buffer
		profiling := pprof.StartCPUProfile(&prof) == nil
		pg0, go0 := pl.backendCPU(ctx), processCPU()
		began := time.Now()
		timer := time.NewTimer(window)
		<-timer.C
		end := time.Now()
		pg1, go1 := pl.backendCPU(ctx), processCPU()
		pg := pg1.since(pg0)
		sp := span{with: with, began: began, end: end, proc: go1 - go0, pg: pg.all, watcher: pg.watcher}
		if profiling {
			pprof.StopCPUProfile()
			var err error
			if sp.labelled, err = labelledCPU(&prof); err != nil {
				b.Fatal(err)
			}
		}
		spans = append(spans, sp)
		stop()
		if _, done := committed(); done {
			break
		}
	}
	close(stopped)
	<-traced
	out := windows{labelled: map[string]time.Duration{}}
	for i := 0; i+1 < len(spans); i += 2 {
		// Once a partition is done the fold slows, fewer partitions
		// left: a window after that is no window of the same fold.
		if !trace.oneDone.IsZero() && spans[i+1].end.After(trace.oneDone) {
			break
		}
		var p pair
		for _, s := range spans[i : i+2] {
			events := trace.at(s.end) - trace.at(s.began)
			took := s.end.Sub(s.began)
			side := &out.without
			if s.with {
				p.with, side = events/took.Seconds(), &out.with
				out.watcher += s.watcher
				for k, v := range s.labelled {
					out.labelled[k] += v
				}
			} else {
				p.without = events / took.Seconds()
			}
			side.events += events
			side.took += took
			side.proc += s.proc
			side.pg += s.pg
		}
		out.pairs = append(out.pairs, p)
	}
	rounds, busy := pl.polls.n.Load()-rounds0, time.Duration(pl.polls.nanos.Load()-busy0)
	b.Logf("%d waiters: %d rounds, reading for %v of the %v they waited (%.1f%%); %d waits reached",
		waiters, rounds, busy.Round(time.Millisecond), out.with.took.Round(time.Millisecond),
		100*busy.Seconds()/out.with.took.Seconds(), reached.Load())
	return out
}

// windows is what engineWindows measured: each pair's events/s, and
// what each side's windows add up to.
type windows struct {
	pairs         []pair
	with, without side
	// watcher is the CPU the watcher's Postgres sessions used, in the
	// windows with waiters.
	watcher time.Duration
	// labelled is the CPU of this process's goroutines carrying
	// costLabel, by its value: the watcher's and the waiting reads'.
	labelled map[string]time.Duration
}

// costLabel is the profiler label of the watcher's and the waiting
// reads' goroutines.
const costLabel = "freshness"

// labelledCPU adds up the CPU samples of a profile by their costLabel.
func labelledCPU(r io.Reader) (map[string]time.Duration, error) {
	p, err := profile.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("read the CPU profile: %w", err)
	}
	i := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" })
	if i < 0 {
		return nil, errors.New("read the CPU profile: no cpu samples")
	}
	out := map[string]time.Duration{}
	for _, s := range p.Sample {
		if l := s.Label[costLabel]; len(l) > 0 {
			out[l[0]] += time.Duration(s.Value[i])
		}
	}
	return out, nil
}

// side adds up the windows of one side.
type side struct {
	events   float64
	took     time.Duration
	proc, pg time.Duration // the CPU this process and Postgres's sessions used
}

func (s side) eps() float64 { return s.events / s.took.Seconds() }

// cpuPerEvent is the CPU, this process's and Postgres's, the side's
// windows used per event committed, in microseconds.
func (s side) cpuPerEvent() float64 { return (s.proc + s.pg).Seconds() * 1e6 / s.events }

// processCPU is the CPU this process has used: the engine's, the
// broker's, the watcher's and the waiting reads'.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpu is what Postgres's sessions have used of the CPU.
type cpu struct{ watcher, all time.Duration }

// sessions is the CPU each of Postgres's client sessions has used, by
// process id, and whether it is the watcher's.
type sessions map[int]session

type session struct {
	cpu     time.Duration
	watcher bool
}

// since is the CPU the sessions used since before: a session that ended
// meanwhile is not counted, one that began is counted whole.
func (s sessions) since(before sessions) cpu {
	var out cpu
	for pid, now := range s {
		d := now.cpu - before[pid].cpu
		out.all += d
		if now.watcher {
			out.watcher += d
		}
	}
	return out
}

// backendCPU reads the CPU time Postgres's client sessions have used
// from /proc, when Postgres runs on this machine and its processes are
// readable; none otherwise.
func (pl *pipeline) backendCPU(ctx context.Context) sessions {
	out := sessions{}
	rows, err := pl.db.Pool.Query(ctx, `SELECT pid, application_name = $1 FROM pg_stat_activity WHERE backend_type = 'client backend'`, watcherApp)
	if err != nil {
		return out
	}
	var (
		pid     int
		watcher bool
	)
	_, _ = pgx.ForEachRow(rows, []any{&pid, &watcher}, func() error {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // the session ended since, or is not this machine's
		}
		// utime and stime, in clock ticks (100 a second), are the 12th
		// and 13th fields after the command's closing parenthesis.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 13 {
			return nil
		}
		user, _ := strconv.ParseInt(f[11], 10, 64)
		sys, _ := strconv.ParseInt(f[12], 10, 64)
		out[pid] = session{cpu: time.Duration(user+sys) * 10 * time.Millisecond, watcher: watcher}
		return nil
	})
	return out
}

// commits is when the stored offsets moved, and to where.
type commits struct {
	t []time.Time
	n []int64
	// oneDone is when a first partition was seen committed to its end.
	oneDone time.Time
}

// progress is the events committed of a stream ending at end, whether
// one partition, and whether every one, is committed to its end.
func progress(ctx context.Context, b *testing.B, pool *pgxpool.Pool, end map[int32]int64) (n int64, one, all bool) {
	rows, err := pool.Query(ctx, `SELECT partition, coalesce(next_offset, 0) FROM projector_offsets WHERE identity = $1`, identity)
	if err != nil {
		b.Fatal(err)
	}
	stored := map[int32]int64{}
	var (
		part int32
		next int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&part, &next}, func() error {
		stored[part] = next
		n += next
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	all = true
	for p, e := range end {
		done := stored[p] >= e
		one = one || done
		all = all && done
	}
	return n, one, all
}

// add records n read at t, when it moved.
func (c *commits) add(t time.Time, n int64) {
	if len(c.n) > 0 && c.n[len(c.n)-1] == n {
		return
	}
	c.t, c.n = append(c.t, t), append(c.n, n)
}

// at is the events committed by t, counting a transaction's events as
// committed evenly over the time since the one before it.
func (c *commits) at(t time.Time) float64 {
	i, _ := slices.BinarySearchFunc(c.t, t, time.Time.Compare)
	switch {
	case i == 0:
		return float64(c.n[0])
	case i == len(c.t):
		return float64(c.n[len(c.n)-1])
	}
	t0, t1 := c.t[i-1], c.t[i]
	f := t.Sub(t0).Seconds() / t1.Sub(t0).Seconds()
	return float64(c.n[i-1]) + f*float64(c.n[i]-c.n[i-1])
}

// waitFor polls cond every few milliseconds for up to 30 seconds.
func waitFor(b *testing.B, cond func() bool) {
	deadline := time.Now().Add(30 * time.Second)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("condition not met in 30s")
		}
		<-t.C
	}
}

type latencies struct {
	p50, p99, max, rate float64
	n                   int
}

// readAfterWrite writes through the outbox at rate writes/s for d, each
// write followed by a read waiting for its version, and returns the
// latencies from the write's transaction to the read's answer.
func readAfterWrite(b *testing.B, rate float64, d time.Duration) latencies {
	ctx := b.Context()
	pl := newPipeline(b, 3, freshness.Config{})
	pl.engine(b)
	// The group has joined once a first write is read.
	if err := pl.write(ctx, "warm-up", 1); err != nil {
		b.Fatal(err)
	}
	if r, err := pl.w.WaitVersion(ctx, "accounts", "warm-up", "", 1, time.Minute); err != nil || !r.Reached {
		b.Fatalf("warm-up: %+v, %v", r, err)
	}

	const workers = 256
	tokens := make(chan struct{}, workers)
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
	)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			versions := map[string]int64{}
			n := 0
			for range tokens {
				key := fmt.Sprintf("rw-%d-%d", i, n%20)
				n++
				versions[key]++
				v := versions[key]
				began := time.Now()
				if err := pl.write(ctx, key, v); err != nil {
					b.Error(err)
					return
				}
				r, err := pl.w.WaitVersion(ctx, "accounts", key, "", v, 30*time.Second)
				if err != nil || !r.Reached || r.Version != v {
					b.Errorf("%s: wrote version %d, read %+v, %v", key, v, r, err)
					return
				}
				mu.Lock()
				lats = append(lats, time.Since(began))
				mu.Unlock()
			}
		}()
	}
	began := time.Now()
	sent := 0
	if rate == 0 {
		for time.Since(began) < d {
			tokens <- struct{}{}
			sent++
		}
	} else {
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		for time.Since(began) < d {
			<-tick.C
			select {
			case tokens <- struct{}{}:
				sent++
			default: // every worker busy: the write is not sent
			}
		}
		tick.Stop()
	}
	close(tokens)
	wg.Wait()
	took := time.Since(began)
	slices.Sort(lats)
	ms := func(q float64) float64 {
		if len(lats) == 0 {
			return 0
		}
		return float64(lats[min(len(lats)-1, int(q*float64(len(lats))))]) / float64(time.Millisecond)
	}
	return latencies{p50: ms(0.50), p99: ms(0.99), max: ms(1), rate: float64(sent) / took.Seconds(), n: len(lats)}
}
