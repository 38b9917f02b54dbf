package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/projector-dev/projector/internal/bench"
	"github.com/projector-dev/projector/internal/cliflag"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks/postgres"
)

type benchFlags struct {
	databaseURL     string
	brokers         string
	events          int
	aggregates      string
	partitions      int
	skew            string
	reorder         float64
	duplicate       float64
	valueBytes      int
	runs            int
	modes           string
	jsonOut         bool
	timeLimit       time.Duration
	freshFor        time.Duration
	freshLoad       string
	rebuildRate     int
	rebuildEvery    time.Duration
	batchMaxRecords int
	commitMax       int
	memberMax       int
	stateCacheRows  int
	stateCacheBytes cliflag.ByteSize
	batchMaxWait    time.Duration
	copyConns       int
	connectScript   string
	connectTasks    int
	connectConfig   string
	profileDir      string
	keepSchemas     bool
	logLevel        string
	worker          string
}

// benchSpawn starts a child of this program running args. Tests replace it
// (their binary is the test binary).
var benchSpawn = func(args []string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exec.Command(exe, args...)
}

// benchHelp says what the command does.
const benchHelp = "Measure the engine against Postgres's COPY limit and hand-written consumers, on one generated stream, with a reference-fold check."

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.databaseURL, "database-url", DefaultDatabaseURL, "PostgreSQL connection URL; every run gets a fresh schema, dropped afterwards")
	fs.StringVar(&f.brokers, "brokers", "", "real Kafka seed brokers, comma-separated; empty: an embedded broker (kfake)")
	fs.IntVar(&f.events, "events", 1_000_000, "events in the stream (10000000 shows whether the engine's RSS stays flat: add --modes engine-fold)")
	fs.StringVar(&f.aggregates, "aggregates", "100000", "accounts the events spread over; a comma list (10000,100000,1000000) adds an engine events/s and a keyed COPY limit per size (scaling)")
	fs.IntVar(&f.partitions, "partitions", 12, "partitions of the topic")
	fs.StringVar(&f.skew, "skew", "uniform", "which account each event belongs to: uniform, or zipf (hot accounts: many events of one account per batch)")
	fs.Float64Var(&f.reorder, "reorder", 0, "share of each account's events that arrive after its next one, parked until their gap fills (not with the transaction-per-event consumers, naive and watermill)")
	fs.Float64Var(&f.duplicate, "duplicate", 0, "share of events sent a second time right after their account's next event, a stale copy the engine ignores (not with naive, watermill, limit-keyed or several --aggregates)")
	fs.IntVar(&f.valueBytes, "value-bytes", 200, "size of each Avro value (the writer schema pads the event)")
	fs.IntVar(&f.runs, "runs", 1, "run every row this many times and report the median")
	fs.StringVar(&f.modes, "modes", strings.Join(bench.AllModes, ","), "rows to run: "+strings.Join(bench.AllModes, ",")+"; also, when named, "+strings.Join(bench.RebuildModes, ",")+
		" (a rebuild of the fold projection: unthrottled from start to cutover, and the live generation's freshness beside one); with --brokers also "+strings.Join(bench.KafkaModes, ",")+" (Kafka Connect with the Debezium JDBC sink)")
	fs.BoolVar(&f.jsonOut, "json", false, "print the report as JSON")
	fs.DurationVar(&f.timeLimit, "time-limit", 15*time.Second, "the naive and watermill consumers stop after this and are measured on the prefix they committed")
	fs.DurationVar(&f.freshFor, "fresh-for", 10*time.Second, "how long the freshness run produces")
	fs.StringVar(&f.freshLoad, "fresh-load", "0.25", "the freshness run's arrival rate, as a fraction of the fold engine's measured events/s; a comma list (0.1,0.25,0.5) runs one freshness run per rate")
	fs.IntVar(&f.rebuildRate, "rebuild-rate", rebuild.DefaultRate, "rebuild-freshness: the --rebuild-rate of the rebuild beside the live generation, records a second; 0: no limit (as projector run; the rebuild row always runs without one)")
	fs.DurationVar(&f.rebuildEvery, "rebuild-check-every", rebuild.DefaultPoll, "rebuild modes: how often the supervisor looks at the rebuild operation (as projector run); the cutover comes two looks after the new generation reaches the log end at most")
	fs.IntVar(&f.batchMaxRecords, "batch-max-records", partition.DefaultBatchMaxRecords, "engine: most records planned together in one batch (as projector run)")
	fs.IntVar(&f.commitMax, "commit-max-batches", partition.DefaultCommitMaxBatches, "engine: most full batches' worth of records one transaction covers while the engine is behind (as projector run)")
	fs.IntVar(&f.memberMax, "member-max-records", projector.DefaultMemberMaxRecords, "engine: records held across partitions, shared among them; 0: no bound (as projector run)")
	fs.IntVar(&f.stateCacheRows, "state-cache-rows", postgres.DefaultStateCacheRows, "engine: aggregates whose rows are kept in memory; 0 disables (as projector run)")
	f.stateCacheBytes = postgres.DefaultStateCacheBytes
	fs.Var(&f.stateCacheBytes, "state-cache-bytes", "engine: memory for those rows, whichever bound comes first; 0 disables (as projector run)")
	fs.DurationVar(&f.batchMaxWait, "batch-max-wait", 50*time.Millisecond, "engine: longest a batch waits for more records (as projector run)")
	fs.IntVar(&f.copyConns, "copy-conns", runtime.NumCPU(), "limit rows: connections that COPY in parallel (default: one per CPU, as the engine may use every core)")
	fs.StringVar(&f.connectScript, "connect-script", "scripts/connect", "connect-jdbc: the script that fetches Kafka Connect and the Debezium JDBC sink from Maven Central and runs a standalone worker")
	fs.IntVar(&f.connectTasks, "connect-tasks", runtime.NumCPU(), "connect-jdbc: the connector's tasks.max (default: one per CPU)")
	fs.StringVar(&f.connectConfig, "connect-config", "", "connect-jdbc: connector settings to add or override, comma-separated key=value (batch.size=5000,use.reduction.buffer=true,consumer.override.max.poll.records=5000)")
	fs.StringVar(&f.profileDir, "cpuprofile-dir", "", "write a CPU profile of every engine run here (engine-fold.pprof, engine-snapshot.pprof, freshness.pprof) and what it allocated (engine-fold.allocs.pprof, ...)")
	fs.BoolVar(&f.keepSchemas, "keep-schemas", false, "keep every run's Postgres schema (to inspect or EXPLAIN)")
	fs.StringVar(&f.logLevel, "log-level", "warn", "log level of the consumers under test")
	fs.StringVar(&f.worker, "worker", "", "internal: run one benchmark child (JSON spec)")
}

// exec runs the benchmark, or, with --worker, one of its children.
func (f *benchFlags) exec(ctx context.Context, stdout, stderr io.Writer) error {
	if f.worker != "" {
		var spec bench.WorkerSpec
		if err := json.Unmarshal([]byte(f.worker), &spec); err != nil {
			return fmt.Errorf("--worker: %w", err)
		}
		// The parent passes the database URL in the environment,
		// where other users of the machine cannot read it.
		if spec.DatabaseURL = os.Getenv(bench.DatabaseURLEnv); spec.DatabaseURL == "" {
			return fmt.Errorf("--worker: %s is not set: the benchmark's children are started by projector-bench", bench.DatabaseURLEnv)
		}
		return bench.RunWorker(ctx, spec, os.Stdin, stdout, stderr)
	}
	return runBench(ctx, f, stdout, stderr)
}

func runBench(ctx context.Context, f *benchFlags, stdout, stderr io.Writer) error {
	cfg := bench.Config{
		Events: f.events, Partitions: f.partitions, Skew: f.skew, Reorder: f.reorder, Duplicate: f.duplicate, ValueBytes: f.valueBytes, Runs: f.runs,
		DatabaseURL: f.databaseURL, TimeLimit: f.timeLimit, FreshFor: f.freshFor, RebuildRate: cliflag.Off(f.rebuildRate), RebuildCheckEvery: f.rebuildEvery,
		BatchMaxRecords: f.batchMaxRecords, BatchMaxWait: f.batchMaxWait, CommitMaxBatches: f.commitMax, CopyConns: f.copyConns,
		ConnectScript: f.connectScript, ConnectTasks: f.connectTasks,
		MemberMaxRecords: cliflag.Off(f.memberMax),
		StateCacheRows:   cliflag.Off(f.stateCacheRows), StateCacheBytes: cliflag.CacheBytes(f.stateCacheBytes),
		ProfileDir: f.profileDir, KeepSchemas: f.keepSchemas, LogLevel: f.logLevel,
		Spawn: benchSpawn, Log: stderr, ChildStderr: stderr,
	}
	if f.rebuildEvery <= 0 {
		return fmt.Errorf("--rebuild-check-every %s: want a positive duration", f.rebuildEvery)
	}
	if f.rebuildRate < 0 {
		return fmt.Errorf("--rebuild-rate %d: want records a second, or 0 for no limit", f.rebuildRate)
	}
	for _, a := range strings.Split(f.aggregates, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		n, err := strconv.Atoi(strings.ReplaceAll(a, "_", ""))
		if err != nil || n < 1 {
			return fmt.Errorf("--aggregates %q: want positive counts, comma-separated", f.aggregates)
		}
		cfg.Aggregates = append(cfg.Aggregates, n)
	}
	for _, l := range strings.Split(f.freshLoad, ",") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(l, "%"), 64)
		if strings.HasSuffix(l, "%") {
			v /= 100
		}
		if err != nil || !(v > 0 && v <= 1) {
			return fmt.Errorf("--fresh-load %q: want fractions of the fold engine's events/s above 0 and at most 1 (0.25 or 25%%), comma-separated", f.freshLoad)
		}
		cfg.FreshLoads = append(cfg.FreshLoads, v)
	}
	for _, m := range strings.Split(f.modes, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.Modes = append(cfg.Modes, m)
		}
	}
	for _, kv := range strings.Split(f.connectConfig, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("--connect-config %q: want key=value pairs, comma-separated", f.connectConfig)
		}
		if cfg.ConnectConfig == nil {
			cfg.ConnectConfig = map[string]string{}
		}
		cfg.ConnectConfig[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	for _, b := range strings.Split(f.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	if f.profileDir != "" {
		if err := os.MkdirAll(f.profileDir, 0o755); err != nil {
			return err
		}
	}
	rep, err := bench.Run(ctx, cfg)
	if rep == nil {
		return err
	}
	var perr error
	if f.jsonOut {
		perr = rep.JSON(stdout)
	} else {
		perr = rep.Table(stdout)
	}
	return errors.Join(err, perr)
}
