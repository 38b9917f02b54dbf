package freshness_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/demo"
)

// BenchmarkReadYourWrites measures what read-your-writes costs the
// engine and what it gives a reader:
//
//   - the engine's events/s folding a produced backlog with no reads
//     waiting, and with 1,000 reads waiting all along, each for the last
//     version of an account the engine is writing (a new one as soon as
//     it is reached), alternately, three times each (medians);
//   - the latency of read-after-write at 10% load: from a service's
//     outbox transaction beginning to the read waiting for the version
//     it wrote returning, through the relay, Kafka and the engine, at a
//     tenth of the writes/s that path carries flat out (measured first).
//
// It runs on the embedded broker unless PROJECTOR_TEST_KAFKA_BROKERS
// names a real cluster: go test -run '^$' -bench ReadYourWrites
// -benchtime 1x ./freshness
func BenchmarkReadYourWrites(b *testing.B) {
	// Each run is a sub-benchmark of its own, so that what it set up (a
	// broker holding its stream) is gone before the next begins.
	// -short (make test's pass over every benchmark) runs each part once
	// and small: it shows the benchmark works, not its figures.
	runs, aggregates, flatOut, loaded := 3, 100_000, 10*time.Second, 20*time.Second
	if testing.Short() {
		runs, aggregates, flatOut, loaded = 1, 5_000, 2*time.Second, 2*time.Second
	}
	var none, waiting []float64
	for i := range runs {
		b.Run(fmt.Sprintf("engine/waiters=0/run=%d", i+1), func(b *testing.B) {
			eps := engineRate(b, 0, aggregates)
			none = append(none, eps)
			b.ReportMetric(eps, "events/s")
		})
		b.Run(fmt.Sprintf("engine/waiters=1000/run=%d", i+1), func(b *testing.B) {
			eps := engineRate(b, 1000, aggregates)
			waiting = append(waiting, eps)
			b.ReportMetric(eps, "events/s")
		})
	}
	if len(none) > 0 && len(waiting) > 0 {
		base, with := median(none), median(waiting)
		b.Logf("engine events/s without waiters %.0f, with 1,000 waiters %.0f: %.1f%% (runs %.0f / %.0f)", base, with, 100*with/base, none, waiting)
	}
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

// engineRate is the events/s of an engine folding a produced stream
// while waiters reads wait for its accounts' last versions.
func engineRate(b *testing.B, waiters, aggregates int) float64 {
	ctx := b.Context()
	pl := newPipeline(b, 3, freshness.Config{})
	records := demo.Generate(demo.Options{Aggregates: aggregates, MeanEvents: 10, Seed: 7})
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

	wctx, stopWaiters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var reached atomic.Int64
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
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
		}()
	}
	defer func() {
		stopWaiters()
		wg.Wait()
	}()
	if waiters > 0 {
		waitFor(b, func() bool { return pl.w.Waiting() >= waiters*9/10 })
	}

	pl.engine(b)
	// Timed from the first commit seen, so that the group's join is not
	// counted, to the last, looked for every few milliseconds.
	var (
		first          time.Time
		fromCount      int64
		rounds0, busy0 int64
	)
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for {
		n, done, err := demo.Committed(ctx, pl.db.Pool, identity, pl.kafka.Topic, end)
		if err != nil {
			b.Fatal(err)
		}
		if first.IsZero() && n > 0 {
			first, fromCount = time.Now(), n
			rounds0, busy0 = pl.polls.n.Load(), pl.polls.nanos.Load()
		}
		if done {
			break
		}
		<-poll.C
	}
	took := time.Since(first)
	if waiters > 0 {
		rounds, busy := pl.polls.n.Load()-rounds0, time.Duration(pl.polls.nanos.Load()-busy0)
		b.Logf("%d waiters: %d rounds in %v, reading for %v of it (%.1f%%)", waiters, rounds, took.Round(time.Millisecond),
			busy.Round(time.Millisecond), 100*busy.Seconds()/took.Seconds())
	}
	var total int64
	for _, e := range end {
		total += e
	}
	if waiters > 0 {
		b.Logf("%d waiters: %d waits reached while the engine ran", waiters, reached.Load())
	}
	return float64(total-fromCount) / took.Seconds()
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
