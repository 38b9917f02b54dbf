package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
)

// runRebuildFreshness measures the live generation's freshness at
// RebuildFreshLoad of maxEPS twice, on one topic: without a rebuild, then
// with one running beside it at Config.RebuildRate. The topic first
// holds a history of Config.Events events, which the live generation of
// each run consumes before its window and the rebuild rebuilds from; each
// window then produces a fresh part of the same stream at the load for
// FreshFor.
func (b *bench) runRebuildFreshness(ctx context.Context, maxEPS float64) ([]*Freshness, error) {
	cfg := b.cfg
	rate := maxEPS * RebuildFreshLoad
	n := max(1, int(math.Round(rate*cfg.FreshFor.Seconds())))
	h := cfg.Events
	ds := &dataset{opts: GenOptions{Events: h + 2*n, Aggregates: cfg.Aggregates[0], Skew: cfg.Skew, CloseEvery: DefaultCloseEvery, Seed: cfg.Seed + 2000}}
	var err error
	if ds.records, err = Generate(ds.opts); err != nil {
		return nil, err
	}
	ds.events = len(ds.records)
	if ds.topic, err = b.topic(ctx, "rebuild-fresh"); err != nil {
		return nil, err
	}
	ds.partOf = make([]int32, len(ds.records))
	ds.offOf = make([]int64, len(ds.records))
	b.logf("%s: producing a history of %d events to %s", ModeRebuildFreshness, h, ds.topic)
	if _, err := b.produceBulk(ctx, ds, 0, h); err != nil {
		return nil, err
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return nil, err
	}
	defer prod.Close()
	var out []*Freshness
	for i, withRebuild := range []bool{false, true} {
		from := h + i*n
		history, err := demo.EndOffsets(ctx, b.adm, ds.topic)
		if err != nil {
			return nil, err
		}
		what := "without a rebuild"
		if withRebuild {
			what = fmt.Sprintf("with a rebuild beside it (--rebuild-rate %s)", rateText(cfg.RebuildRate))
		}
		b.logf("%s: the live generation consumes %d events, then %d are produced at %.0f events/s (%.0f%%), %s", ModeRebuildFreshness, from, n, rate, 100*RebuildFreshLoad, what)
		fr, err := b.rebuildFreshRun(ctx, ds, prod, history, from, n, rate, withRebuild)
		if err != nil {
			return nil, fmt.Errorf("freshness %s: %w", what, err)
		}
		out = append(out, fr)
	}
	return out, nil
}

// rateText is a --rebuild-rate for people.
func rateText(r int) string {
	if r <= 0 {
		return "0 (no limit)"
	}
	return group(int64(r))
}

// rebuildFreshName names a rebuild-freshness run.
func rebuildFreshName(f *Freshness) string {
	if f.Rebuild == nil {
		return "without a rebuild"
	}
	return fmt.Sprintf("with a rebuild (--rebuild-rate %s)", rateText(f.Rebuild.Rate))
}

// rebuildFreshRun is one rebuild-freshness run: a child whose live
// generation consumes the topic up to history, then, in the window,
// ds.records[from:from+n] produced at rate.
func (b *bench) rebuildFreshRun(ctx context.Context, ds *dataset, prod *kgo.Client, history map[int32]int64, from, n int, rate float64, withRebuild bool) (*Freshness, error) {
	cfg := b.cfg
	values := make([][]byte, n)
	for i := range values {
		values[i] = AppendValue(nil, b.schemaID, ds.records[from+i].Event, cfg.ValueBytes)
	}
	stamp := make([]int64, n)
	fr := &Freshness{Load: RebuildFreshLoad, TargetRate: rate, Events: n}
	during := func(ctx context.Context, started <-chan struct{}, send func(command) error) error {
		select {
		case <-started:
		case <-ctx.Done():
			return ctx.Err()
		}
		secs, err := producePaced(ctx, prod, ds, values, stamp, from, n, rate)
		if err != nil {
			return err
		}
		fr.Seconds = secs
		fr.ProducedRate = float64(n) / secs
		end, err := demo.EndOffsets(ctx, b.adm, ds.topic)
		if err != nil {
			return err
		}
		return send(command{Cmd: "end", End: end})
	}
	spec := WorkerSpec{
		Mode: ModeRebuildFreshness, Topic: ds.topic, Partitions: cfg.Partitions, HistoryEnd: history, Rebuild: withRebuild,
		BatchMaxRecords: cfg.BatchMaxRecords, BatchMaxWait: cfg.BatchMaxWait, CommitMaxBatches: cfg.CommitMaxBatches,
		StateCacheRows: cfg.StateCacheRows, StateCacheBytes: cfg.StateCacheBytes, MemberMaxRecords: cfg.MemberMaxRecords, CommitLog: true,
		RebuildPoll: cfg.RebuildCheckEvery,
	}
	if withRebuild && cfg.RebuildRate > 0 {
		spec.RebuildRate = cfg.RebuildRate
	}
	if cfg.ProfileDir != "" {
		name := ModeRebuildFreshness + "-without.pprof"
		if withRebuild {
			name = ModeRebuildFreshness + "-with.pprof"
		}
		spec.CPUProfile = filepath.Join(cfg.ProfileDir, name)
	}
	exp := demo.Fold(ds.records[:from+n])
	s, err := b.runChild(ctx, spec, during, func(ctx context.Context, pool *pgxpool.Pool, _ *WorkerResult) error {
		// The rebuild never cut over: the projection's table is still
		// the live generation's, which consumed everything produced.
		if err := demo.Verify(ctx, pool, demo.Table, exp); err != nil {
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
	fr.Rebuild = s.Result.Rebuild
	partOf, offOf := ds.partOf[from:from+n], ds.offOf[from:from+n]
	if x := fr.Rebuild; x != nil {
		// Only what was produced while the rebuild ran beside the live
		// generation.
		var p []int32
		var o, st []int64
		for i, at := range stamp {
			if at >= x.FromNS && at <= x.ToNS {
				p, o, st = append(p, partOf[i]), append(o, offOf[i]), append(st, at)
			}
		}
		if len(st) == 0 {
			return nil, fmt.Errorf("nothing was produced in the %.2fs the rebuild ran beside the live generation", float64(x.ToNS-x.FromNS)/1e9)
		}
		partOf, offOf, stamp = p, o, st
		fr.Events = len(st)
		fr.Seconds = float64(x.ToNS-x.FromNS) / 1e9
		fr.ProducedRate = float64(len(st)) / fr.Seconds
	}
	lat, err := latencies(s.Result.Commits, partOf, offOf, stamp)
	if err != nil {
		return nil, err
	}
	fr.P50MS, fr.P90MS, fr.P99MS, fr.MaxMS = pct(lat, 0.50), pct(lat, 0.90), pct(lat, 0.99), pct(lat, 1)
	return fr, nil
}
