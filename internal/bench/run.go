package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/rebuild"
)

// Config is one `projector-bench` invocation.
type Config struct {
	Events int
	// Aggregates lists stream sizes: the first gets every row of the
	// table, each further one an engine (fold) run for the scaling table.
	Aggregates []int
	Partitions int
	Skew       string
	// Reorder is the share of an account's events that arrive after its
	// next one (engine modes only: the others apply events as they come).
	Reorder float64
	// Duplicate is the share of events sent again after their account's
	// next one (stale copies the engine ignores).
	Duplicate   float64
	ValueBytes  int
	Runs        int
	DatabaseURL string
	// Brokers are real Kafka seed brokers; empty: an embedded kfake
	// cluster in this process.
	Brokers []string
	// Modes to run, of ModeLimit, ModeLimitKeyed, ModeEngineSnapshot, ModeEngineFold,
	// ModeUpsert, ModeNaive, ModeWatermill, "freshness", the RebuildModes
	// and, with Brokers, ModeConnectJDBC.
	Modes []string
	// TimeLimit bounds the naive and Watermill runs: they are measured on
	// the prefix they commit within it.
	TimeLimit time.Duration
	// FreshFor and FreshLoads: a freshness run produces at each of
	// FreshLoads times the fold engine's measured events/s for FreshFor.
	FreshFor   time.Duration
	FreshLoads []float64
	// RebuildRate is the --rebuild-rate of the rebuild that runs beside
	// the live generation in the rebuild-freshness run (0: as projector
	// run has it, rebuild.DefaultRate; negative: no limit). The rebuild
	// row always runs without a limit.
	RebuildRate int
	// RebuildCheckEvery is how often the rebuild modes' supervisor looks
	// at the operation (0: as projector run has it, rebuild.DefaultPoll).
	RebuildCheckEvery time.Duration
	// BatchMaxRecords and BatchMaxWait configure the engine (0: the
	// engine's defaults, as `projector run` has them).
	BatchMaxRecords int
	BatchMaxWait    time.Duration
	// CommitMaxBatches is how many batches one transaction may cover
	// while the engine is behind (0: the default).
	CommitMaxBatches int
	// MemberMaxRecords bounds the records the engine holds across its
	// partitions (0: the default; negative: no bound).
	MemberMaxRecords int
	// StateCacheRows and StateCacheBytes bound the engine's state cache
	// (0: the default, as `projector run` has it; negative: off).
	StateCacheRows  int
	StateCacheBytes int64
	CopyConns       int
	// ConnectScript is scripts/connect, which the Kafka Connect peer
	// fetches and runs Connect with; ConnectTasks is its connector's
	// tasks.max (0: one per CPU).
	ConnectScript string
	ConnectTasks  int
	// ConnectConfig overrides or adds connector settings (batch.size,
	// use.reduction.buffer, consumer.override.max.poll.records, ...).
	ConnectConfig map[string]string
	Seed          uint64
	// ProfileDir, when set, receives a CPU profile of every engine child
	// (<mode>.pprof) for `go tool pprof`.
	ProfileDir string
	// KeepSchemas leaves the runs' Postgres schemas in place (for EXPLAIN).
	KeepSchemas bool
	LogLevel    string
	// Spawn returns the command that starts a child running the given
	// arguments of this program (`--worker <spec>`).
	Spawn func(args []string) *exec.Cmd
	// Log receives progress lines; ChildStderr the children's logs.
	Log         io.Writer
	ChildStderr io.Writer
}

// ModeFreshness is the freshness run (an engine fold run at a steady
// arrival rate).
const ModeFreshness = "freshness"

// DefaultFreshLoad is the freshness run's arrival rate, as a fraction of
// the fold engine's measured events/s.
const DefaultFreshLoad = 0.25

// throughputModes are the rows that measure events/s, in order.
var throughputModes = []string{ModeLimit, ModeLimitKeyed, ModeEngineSnapshot, ModeEngineFold, ModeRebuild, ModeUpsert, ModeNaive, ModeWatermill, ModeConnectJDBC}

// RebuildModes are the rows of a rebuild, run only when asked for: they
// measure another operation than consuming a stream, over minutes.
var RebuildModes = []string{ModeRebuild, ModeRebuildFreshness}

// KafkaModes are the rows that run only on real Kafka (Config.Brokers),
// and only when asked for.
var KafkaModes = []string{ModeConnectJDBC}

// AllModes are the rows of a full run, in order.
var AllModes = append(slices.DeleteFunc(slices.Clone(throughputModes), func(m string) bool {
	return slices.Contains(KafkaModes, m) || slices.Contains(RebuildModes, m)
}), ModeFreshness)

// Sample is one child run.
type Sample struct {
	Mode      string
	Result    WorkerResult
	PGCPU     *float64 // nil: /proc of the backends not readable
	PGCPUNote string
	// ParentCPU is this process's CPU in the window: the embedded broker
	// and registry (when embedded) and the harness.
	ParentCPU  float64
	PeakRSSMB  float64
	RSSSamples []float64 // every 250 ms through the window
	Check      error
}

// EPS is the sample's events per second.
func (s *Sample) EPS() float64 {
	if s.Result.Seconds <= 0 {
		return 0
	}
	return float64(s.Result.Events) / s.Result.Seconds
}

// dataset is a generated stream produced to its own topic.
type dataset struct {
	topic      string
	opts       GenOptions
	records    []demo.Record
	events     int // len(records), kept when records are dropped
	partOf     []int32
	offOf      []int64
	end        map[int32]int64
	valueBytes float64 // mean value size
	exp        demo.Expected
}

// bench is one Run's shared state.
type bench struct {
	cfg      Config
	admin    *pgxpool.Pool
	brokers  []string
	regURL   string
	reg      *sr.Client
	schemaID int
	prod     *kgo.Client
	adm      *kadm.Client
	topics   []string
	tmp      string
	runID    string
	// connectTopics holds each dataset's stream in JSON with schemas,
	// once the Kafka Connect peer has run on it.
	connectTopics map[*dataset]*connectTopic
}

func (b *bench) logf(format string, args ...any) {
	if b.cfg.Log != nil {
		fmt.Fprintf(b.cfg.Log, "bench: "+format+"\n", args...)
	}
}

// Run runs the benchmark and returns its report. A run whose result
// differs from the reference fold does not stop the others: it is marked
// in its row and Report.Failed, and Run returns the report with an error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, runID: fmt.Sprintf("%06x", rand.Uint32()&0xffffff)}
	var err error
	if b.tmp, err = os.MkdirTemp("", "projector-bench-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(b.tmp)
	if b.admin, err = pgxpool.New(ctx, cfg.DatabaseURL); err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	defer b.admin.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = b.admin.Ping(pctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL (--database-url): %w", err)
	}
	rep := &Report{Settings: Settings{
		Events: cfg.Events, Aggregates: cfg.Aggregates[0], Partitions: cfg.Partitions, Skew: cfg.Skew, Reorder: cfg.Reorder, Duplicate: cfg.Duplicate,
		Runs: cfg.Runs, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		TimeLimitSeconds: cfg.TimeLimit.Seconds(), BatchMaxRecords: cfg.BatchMaxRecords, BatchMaxWaitMS: float64(cfg.BatchMaxWait) / 1e6,
		CommitMaxBatches: cfg.CommitMaxBatches,
		StateCacheRows:   cfg.StateCacheRows, StateCacheBytes: cfg.StateCacheBytes,
		MemberMaxRecords: cfg.MemberMaxRecords, CopyConns: cfg.CopyConns,
	}}
	_ = b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit'), current_setting('shared_buffers')`).
		Scan(&rep.Settings.Postgres, &rep.Settings.Fsync, &rep.Settings.SyncCommit, &rep.Settings.SharedBuffers)
	if u, err := url.Parse(cfg.DatabaseURL); err == nil {
		rep.Settings.Database = u.Host + u.Path
	}

	if len(cfg.Brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("start embedded broker: %w", err)
		}
		defer cluster.Close()
		b.brokers = cluster.ListenAddrs()
		rep.Settings.Kafka = "embedded kfake (in the parent process)"
	} else {
		b.brokers = cfg.Brokers
		rep.Settings.Kafka = strings.Join(cfg.Brokers, ",")
	}
	registry := srfake.New()
	defer registry.Close()
	b.regURL = registry.URL()
	if b.reg, err = sr.NewClient(sr.URLs(b.regURL)); err != nil {
		return nil, err
	}
	if b.prod, err = kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(100_000), kgo.ProducerBatchMaxBytes(1<<20)); err != nil {
		return nil, err
	}
	defer b.prod.Close()
	b.adm = kadm.NewClient(b.prod)
	defer b.deleteTopics()

	main, err := b.dataset(ctx, cfg.Aggregates[0], cfg.Events, cfg.Seed, "main")
	if err != nil {
		return nil, err
	}
	rep.Settings.ValueBytes = main.valueBytes
	rep.Settings.Distinct = len(main.exp.Accounts) + main.exp.Deleted

	// The scaling sizes beyond the first run in the same rounds as the
	// table's rows, so that a machine whose speed drifts over minutes
	// weighs on every size alike.
	var scaled []*dataset
	for i, size := range cfg.Aggregates[1:] {
		ds, err := b.dataset(ctx, size, cfg.Events, cfg.Seed+uint64(i)+1, fmt.Sprintf("a%d", size))
		if err != nil {
			return nil, err
		}
		ds.records = nil // an engine run is checked against ds.exp alone
		scaled = append(scaled, ds)
	}
	scaleSamples := make([][]*Sample, len(scaled))
	// Every size's stream is also copied into the keyed COPY limit's table
	// once per round: what Postgres takes in keyed rows per second on it
	// bounds what any consumer that writes that size's rows could reach.
	keyedSamples := make([][]*Sample, len(cfg.Aggregates))
	keyedSize := func(ctx context.Context, i int, ds *dataset) error {
		s, err := b.runThroughput(ctx, ModeLimitKeyed, ds)
		if err != nil {
			return fmt.Errorf("keyed COPY limit over %d aggregates: %w", cfg.Aggregates[i], err)
		}
		b.logf("keyed COPY limit, %d aggregates: %d rows in %.1fs = %.0f rows/s", cfg.Aggregates[i], s.Result.Events, s.Result.Seconds, s.EPS())
		keyedSamples[i] = append(keyedSamples[i], s)
		return nil
	}

	samples := map[string][]*Sample{}
	has := func(m string) bool { return slices.Contains(cfg.Modes, m) }
	for run := 1; run <= cfg.Runs; run++ {
		for _, mode := range throughputModes {
			if !has(mode) {
				continue
			}
			b.logf("run %d/%d: %s", run, cfg.Runs, mode)
			s, err := b.runThroughput(ctx, mode, main)
			if err != nil {
				if mode == ModeWatermill || mode == ModeConnectJDBC {
					rep.NotRun = append(rep.NotRun, NotRun{Mode: mode, Reason: err.Error()})
					b.logf("%s: not run: %v", mode, err)
					cfg.Modes = slices.DeleteFunc(cfg.Modes, func(m string) bool { return m == mode })
					if mode == ModeConnectJDBC {
						// Asked for by name, on real Kafka: the run fails,
						// after the rows that did run are reported.
						rep.Failed = append(rep.Failed, fmt.Sprintf("%s: not run: %s", rowNames[mode], oneLine(err.Error())))
					}
					continue
				}
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			if s.Check != nil {
				b.logf("%s: FAILED the reference check: %v", mode, s.Check)
			}
			b.logf("%s: %d events in %.1fs = %.0f events/s", mode, s.Result.Events, s.Result.Seconds, s.EPS())
			samples[mode] = append(samples[mode], s)
		}
		for i, ds := range scaled {
			b.logf("run %d/%d: scaling, %d aggregates", run, cfg.Runs, cfg.Aggregates[i+1])
			s, err := b.runThroughput(ctx, ModeEngineFold, ds)
			if err != nil {
				return nil, fmt.Errorf("scaling %d aggregates: %w", cfg.Aggregates[i+1], err)
			}
			b.logf("scaling, %d aggregates: %d events in %.1fs = %.0f events/s", cfg.Aggregates[i+1], s.Result.Events, s.Result.Seconds, s.EPS())
			scaleSamples[i] = append(scaleSamples[i], s)
		}
		if len(scaled) > 0 && !has(ModeLimitKeyed) {
			if err := keyedSize(ctx, 0, main); err != nil {
				return nil, err
			}
		}
		for i, ds := range scaled {
			if err := keyedSize(ctx, i+1, ds); err != nil {
				return nil, err
			}
		}
	}
	for _, mode := range throughputModes {
		if ss := samples[mode]; len(ss) > 0 {
			rep.add(mode, ss, len(main.records))
		}
	}

	// The freshness runs produce at a fraction of the fold engine's
	// events/s: its row's, or that of a run of its own.
	var maxEPS float64
	if has(ModeFreshness) || has(ModeRebuildFreshness) {
		if r := rep.row(ModeEngineFold); r != nil {
			maxEPS = r.EventsPerSec
		} else {
			s, err := b.runThroughput(ctx, ModeEngineFold, main)
			if err != nil {
				return nil, err
			}
			maxEPS = s.EPS()
		}
	}
	if has(ModeFreshness) {
		for i, load := range cfg.FreshLoads {
			b.logf("freshness: producing at %.0f events/s (%.0f%%) for %s", maxEPS*load, 100*load, cfg.FreshFor)
			fr, err := b.runFreshness(ctx, main, i, load, maxEPS*load)
			if err != nil {
				return nil, fmt.Errorf("freshness at %.0f%%: %w", 100*load, err)
			}
			if fr.Check != "ok" {
				rep.Failed = append(rep.Failed, fmt.Sprintf("freshness run at %.0f%%: %s", 100*load, fr.Check))
			}
			if len(cfg.FreshLoads) > 1 {
				rep.FreshnessLoads = append(rep.FreshnessLoads, fr)
			}
			if i > 0 {
				continue
			}
			rep.Freshness = fr
		}
	}

	if has(ModeRebuildFreshness) {
		frs, err := b.runRebuildFreshness(ctx, maxEPS)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ModeRebuildFreshness, err)
		}
		for _, fr := range frs {
			if fr.Check != "ok" {
				rep.Failed = append(rep.Failed, fmt.Sprintf("freshness %s: %s", rebuildFreshName(fr), fr.Check))
			}
		}
		rep.RebuildFreshness = frs
	}

	if len(cfg.Aggregates) > 1 {
		rep.Scaling = append(rep.Scaling, ScalePoint{Aggregates: cfg.Aggregates[0], Events: cfg.Events})
		if r := rep.row(ModeEngineFold); r != nil {
			rep.Scaling[0].EventsPerSec = r.EventsPerSec
			rep.Scaling[0].RowWrites = r.RowWrites
			rep.Scaling[0].GoCPUPerEvUS, rep.Scaling[0].PGCPUPerEvUS = r.GoCPUPerEvUS, r.PGCPUPerEvUS
			rep.Scaling[0].RunsEPS = r.RunsEPS
		}
		for i, size := range cfg.Aggregates[1:] {
			s := median(scaleSamples[i])
			p := ScalePoint{Aggregates: size, Events: cfg.Events, EventsPerSec: s.EPS(), RowWrites: s.Result.RowWrites, Check: "ok"}
			if ev := float64(s.Result.Events); ev > 0 {
				p.GoCPUPerEvUS = s.Result.CPUSeconds / ev * 1e6
				if s.PGCPU != nil {
					us := *s.PGCPU / ev * 1e6
					p.PGCPUPerEvUS = &us
				}
			}
			p.RunsEPS = runsEPS(scaleSamples[i])
			if err := failed(scaleSamples[i]); err != nil {
				p.Check = "FAILED: " + err.Error()
				rep.Failed = append(rep.Failed, fmt.Sprintf("engine fold over %d aggregates: %v", size, err))
			}
			rep.Scaling = append(rep.Scaling, p)
		}
		if r := rep.row(ModeEngineFold); r != nil {
			rep.Scaling[0].Check = r.Check
		}
		for i := range cfg.Aggregates {
			if ks := keyedSamples[i]; len(ks) > 0 {
				rep.scaleKeyed(i, ks)
			}
		}
		if r := rep.row(ModeLimitKeyed); r != nil {
			rep.Scaling[0].KeyedLimitEPS = r.EventsPerSec // the table's row ran on the first size's stream
		}
	}
	rep.finish()
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("reference check failed: %s", strings.Join(rep.Failed, "; "))
	}
	return rep, nil
}

func (c *Config) defaults() error {
	if c.Events < 1 {
		return errors.New("--events must be at least 1")
	}
	if len(c.Aggregates) == 0 {
		c.Aggregates = []int{100_000}
	}
	for _, a := range c.Aggregates {
		if a < 1 {
			return errors.New("--aggregates: every size must be at least 1")
		}
	}
	if c.Partitions < 1 {
		return errors.New("--partitions must be at least 1")
	}
	switch c.Skew {
	case "", "none":
		c.Skew = SkewUniform
	case SkewUniform, SkewZipf:
	default:
		return fmt.Errorf("--skew %q: want uniform or zipf", c.Skew)
	}
	if c.Reorder < 0 || c.Reorder > 1 {
		return fmt.Errorf("--reorder %v: want a share from 0 to 1", c.Reorder)
	}
	if c.Duplicate < 0 || c.Duplicate > 1 {
		return fmt.Errorf("--duplicate %v: want a share from 0 to 1", c.Duplicate)
	}
	if c.Duplicate > 0 && len(c.Aggregates) > 1 {
		return errors.New("--duplicate with several --aggregates: the scaling table's keyed COPY limit takes each version of an account once")
	}
	if c.Runs < 1 {
		c.Runs = 1
	}
	if len(c.Modes) == 0 {
		c.Modes = AllModes
	}
	for _, m := range c.Modes {
		if !slices.Contains(AllModes, m) && !slices.Contains(KafkaModes, m) && !slices.Contains(RebuildModes, m) {
			return fmt.Errorf("--modes: %q: want some of %s,%s, or with --brokers %s", m, strings.Join(AllModes, ","), strings.Join(RebuildModes, ","), strings.Join(KafkaModes, ","))
		}
		if slices.Contains(KafkaModes, m) && len(c.Brokers) == 0 {
			return fmt.Errorf("--modes %s needs --brokers: Kafka Connect runs in a JVM of its own against a real Kafka cluster "+
				"(scripts/kafka up starts one; make bench-kafka runs it), not against the embedded broker", m)
		}
		if c.Reorder > 0 && (m == ModeNaive || m == ModeWatermill) {
			return fmt.Errorf("--reorder with --modes %s: the transaction-per-event consumers apply events as they come and would fail the reference check; leave them out", m)
		}
		if c.Duplicate > 0 && (m == ModeNaive || m == ModeWatermill || m == ModeLimitKeyed) {
			return fmt.Errorf("--duplicate with --modes %s: it takes each version of an account once (the transaction-per-event consumers apply a copy again, the keyed COPY limit's key refuses it); leave it out", m)
		}
	}
	if c.TimeLimit <= 0 {
		c.TimeLimit = 15 * time.Second
	}
	if c.FreshFor <= 0 {
		c.FreshFor = 10 * time.Second
	}
	if len(c.FreshLoads) == 0 {
		c.FreshLoads = []float64{DefaultFreshLoad}
	}
	for _, l := range c.FreshLoads {
		if !(l > 0 && l <= 1) {
			return fmt.Errorf("--fresh-load: %v: want fractions of the fold engine's events/s above 0 and at most 1", l)
		}
	}
	if c.RebuildRate == 0 {
		c.RebuildRate = rebuild.DefaultRate
	}
	if c.BatchMaxRecords <= 0 {
		c.BatchMaxRecords = partition.DefaultBatchMaxRecords
	}
	if c.BatchMaxWait <= 0 {
		c.BatchMaxWait = 50 * time.Millisecond
	}
	if c.CommitMaxBatches <= 0 {
		c.CommitMaxBatches = partition.DefaultCommitMaxBatches
	}
	if c.CopyConns <= 0 {
		c.CopyConns = 1
	}
	if c.ConnectScript == "" {
		c.ConnectScript = filepath.Join("scripts", "connect")
	}
	if c.ConnectTasks <= 0 {
		c.ConnectTasks = runtime.NumCPU()
	}
	if c.ValueBytes <= 0 {
		c.ValueBytes = 200
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Spawn == nil {
		return errors.New("bench: Config.Spawn is required")
	}
	return nil
}

// dataset generates a stream and produces it to a topic of its own.
func (b *bench) dataset(ctx context.Context, aggregates, events int, seed uint64, name string) (*dataset, error) {
	ds := &dataset{opts: GenOptions{Events: events, Aggregates: aggregates, Skew: b.cfg.Skew, CloseEvery: DefaultCloseEvery, Reorder: b.cfg.Reorder, Duplicate: b.cfg.Duplicate, Seed: seed}}
	began := time.Now()
	var err error
	if ds.records, err = Generate(ds.opts); err != nil {
		return nil, err
	}
	ds.exp, ds.events = demo.Fold(ds.records), len(ds.records)
	if ds.topic, err = b.topic(ctx, name); err != nil {
		return nil, err
	}
	b.logf("%s: %d events over %d aggregates generated; producing to %s", name, events, aggregates, ds.topic)
	ds.partOf = make([]int32, len(ds.records))
	ds.offOf = make([]int64, len(ds.records))
	total, err := b.produceBulk(ctx, ds, 0, len(ds.records))
	if err != nil {
		return nil, err
	}
	ds.valueBytes = float64(total) / float64(max(1, len(ds.records)))
	if ds.end, err = demo.EndOffsets(ctx, b.adm, ds.topic); err != nil {
		return nil, err
	}
	b.logf("%s: %d events produced in %.1fs (values %.0f bytes on average)", name, len(ds.records), time.Since(began).Seconds(), ds.valueBytes)
	return ds, nil
}

// produceBulk produces ds.records[from:to] to ds.topic as fast as the
// producer takes them, noting where each landed, and returns the bytes of
// their values.
func (b *bench) produceBulk(ctx context.Context, ds *dataset, from, to int) (int64, error) {
	var (
		mu       sync.Mutex
		firstErr error
		total    int64
	)
	const chunk = 20_000
	for start := from; start < to; start += chunk {
		recs := ds.records[start:min(start+chunk, to)]
		arena := make([]byte, 0, len(recs)*(b.cfg.ValueBytes+8))
		for i, r := range recs {
			begin := len(arena)
			arena = AppendValue(arena, b.schemaID, r.Event, b.cfg.ValueBytes)
			total += int64(len(arena) - begin)
			idx := start + i
			rec := &kgo.Record{Topic: ds.topic, Key: []byte(r.Key), Value: arena[begin:len(arena):len(arena)]}
			b.prod.Produce(ctx, rec, func(r *kgo.Record, err error) {
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
	}
	if err := b.prod.Flush(ctx); err != nil {
		return 0, err
	}
	if firstErr != nil {
		return 0, fmt.Errorf("produce: %w", firstErr)
	}
	return total, nil
}

// topic creates a topic of the run and registers the writer schema under
// its value subject.
func (b *bench) topic(ctx context.Context, name string) (string, error) {
	t := fmt.Sprintf("projector-bench-%s-%s", b.runID, name)
	if _, err := b.adm.CreateTopic(ctx, int32(b.cfg.Partitions), -1, nil, t); err != nil {
		return "", fmt.Errorf("create topic %s: %w", t, err)
	}
	b.topics = append(b.topics, t)
	ss, err := b.reg.CreateSchema(ctx, t+"-value", sr.Schema{Schema: WriterSchema, Type: sr.TypeAvro})
	if err != nil {
		return "", fmt.Errorf("register writer schema: %w", err)
	}
	b.schemaID = ss.ID
	return t, nil
}

func (b *bench) deleteTopics() {
	if len(b.topics) == 0 || len(b.cfg.Brokers) == 0 {
		return // the embedded cluster goes away as a whole
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = b.adm.DeleteTopics(ctx, b.topics...)
}

// runThroughput runs one mode over a produced dataset and checks its result
// against the reference fold.
func (b *bench) runThroughput(ctx context.Context, mode string, ds *dataset) (*Sample, error) {
	if mode == ModeConnectJDBC {
		return b.runConnectPeer(ctx, ds)
	}
	spec := WorkerSpec{
		Mode: mode, Topic: ds.topic, Partitions: b.cfg.Partitions, End: ds.end,
		BatchMaxRecords: b.cfg.BatchMaxRecords, BatchMaxWait: b.cfg.BatchMaxWait, CommitMaxBatches: b.cfg.CommitMaxBatches,
		StateCacheRows: b.cfg.StateCacheRows, StateCacheBytes: b.cfg.StateCacheBytes, MemberMaxRecords: b.cfg.MemberMaxRecords,
		TimeLimit: b.cfg.TimeLimit, Gen: ds.opts, ValueBytes: b.cfg.ValueBytes, CopyConns: b.cfg.CopyConns,
		RebuildPoll: b.cfg.RebuildCheckEvery,
	}
	// The rebuild row runs without a throttle (--rebuild-rate 0): it
	// measures how fast a rebuild can go.
	if b.cfg.ProfileDir != "" && (mode == ModeEngineFold || mode == ModeEngineSnapshot || mode == ModeRebuild) {
		spec.CPUProfile = filepath.Join(b.cfg.ProfileDir, mode+".pprof")
	}
	return b.runChild(ctx, spec, nil, func(ctx context.Context, pool *pgxpool.Pool, res *WorkerResult) error {
		return b.check(ctx, pool, mode, ds, res)
	})
}

// runChild runs one child process: it gives it a fresh schema, starts its
// window once it is ready, samples its RSS, reads the CPU time of its
// Postgres backends before and after, and checks the result. during, if
// set, runs once the window has started (the freshness producer).
func (b *bench) runChild(ctx context.Context, spec WorkerSpec, during func(ctx context.Context, started <-chan struct{}, send func(command) error) error,
	check func(ctx context.Context, pool *pgxpool.Pool, res *WorkerResult) error) (*Sample, error) {
	schema := fmt.Sprintf("bench_%s_%s_%x", b.runID, strings.ReplaceAll(spec.Mode, "-", "_"), rand.Uint32()&0xffff)
	if _, err := b.admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	if !b.cfg.KeepSchemas {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = b.admin.Exec(dctx, "DROP SCHEMA "+schema+" CASCADE")
		}()
	} else {
		b.logf("%s: schema %s kept", spec.Mode, schema)
	}
	u, err := url.Parse(b.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	spec.DatabaseURL = u.String()
	spec.Brokers = b.brokers
	spec.RegistryURL = b.regURL
	spec.LogLevel = b.cfg.LogLevel
	if spec.Identity == "" {
		spec.Identity = schema
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := b.cfg.Spawn([]string{"--worker", string(raw)})
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, DatabaseURLEnv+"="+spec.DatabaseURL)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if b.cfg.ChildStderr != nil {
		cmd.Stderr = b.cfg.ChildStderr
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child: %w", err)
	}
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	var sendMu sync.Mutex
	enc := json.NewEncoder(stdin)
	send := func(c command) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return enc.Encode(c)
	}
	msgs := make(chan wireMsg, 4)
	go func() {
		defer close(msgs)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<28)
		for sc.Scan() {
			var m wireMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err == nil && m.Event != "" {
				msgs <- m
			}
		}
	}()
	next := func(timeout time.Duration) (wireMsg, error) {
		select {
		case m, ok := <-msgs:
			if !ok {
				return wireMsg{}, errors.New("child exited without a result (its log is above)")
			}
			if m.Event == "error" {
				return m, errors.New(m.Error)
			}
			return m, nil
		case <-time.After(timeout):
			return wireMsg{}, fmt.Errorf("child silent for %s", timeout)
		case <-ctx.Done():
			return wireMsg{}, ctx.Err()
		}
	}
	if _, err := next(5 * time.Minute); err != nil {
		return nil, err
	}
	s := &Sample{Mode: spec.Mode}
	base, pgErr := readBackends(ctx, b.admin, schema)
	parent0 := cpuSeconds()
	if err := send(command{Cmd: "go"}); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	stopRSS := make(chan struct{})
	rssDone := make(chan []float64, 1)
	go func() {
		var out []float64
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopRSS:
				rssDone <- out
				return
			case <-t.C:
				if mb, err := rssMB(pid); err == nil {
					out = append(out, mb)
				}
			}
		}
	}()
	duringErr := make(chan error, 1)
	started := make(chan struct{})
	dctx, cancelDuring := context.WithCancel(ctx)
	defer cancelDuring()
	if during != nil {
		go func() { duringErr <- during(dctx, started, send) }()
	} else {
		duringErr <- nil
	}
	var m wireMsg
	for {
		m, err = next(time.Hour)
		if err != nil || m.Event != "started" {
			break
		}
		select {
		case <-started:
		default:
			close(started)
		}
	}
	s.ParentCPU = cpuSeconds() - parent0
	cancelDuring()
	close(stopRSS)
	s.RSSSamples = <-rssDone
	if err != nil {
		return nil, err
	}
	if err := <-duringErr; err != nil {
		return nil, err
	}
	s.Result = *m.Result
	if pgErr == nil {
		var after backendCPU
		if after, pgErr = readBackends(ctx, b.admin, schema); pgErr == nil {
			v := after.since(base)
			s.PGCPU = &v
		}
	}
	if pgErr != nil {
		s.PGCPUNote = pgErr.Error()
	}
	if err := send(command{Cmd: "exit"}); err != nil {
		return nil, err
	}
	stdin.Close()
	werr := cmd.Wait()
	exited = true
	s.PeakRSSMB = s.Result.PeakRSSMB
	if werr != nil {
		return nil, fmt.Errorf("child: %w", werr)
	}
	pool, err := pgxpool.New(ctx, spec.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	s.Check = check(ctx, pool, &s.Result)
	return s, nil
}

// median returns the sample with the median events/s (the lower middle one
// for an even count).
func median(ss []*Sample) *Sample {
	sorted := slices.Clone(ss)
	slices.SortFunc(sorted, func(a, b *Sample) int {
		switch {
		case a.EPS() < b.EPS():
			return -1
		case a.EPS() > b.EPS():
			return 1
		}
		return 0
	})
	return sorted[(len(sorted)-1)/2]
}
