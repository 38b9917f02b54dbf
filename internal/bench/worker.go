package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/projector-dev/projector/internal/redact"
)

// Worker modes: what a child process runs.
const (
	ModeLimit          = "limit"
	ModeLimitKeyed     = "limit-keyed"
	ModeEngineSnapshot = "engine-snapshot"
	ModeEngineFold     = "engine-fold"
	// ModeUpsert is the peer a competent engineer writes in a day: one
	// multi-row upsert per poll, guarded by version (see runUpsert).
	ModeUpsert    = "upsert"
	ModeNaive     = "naive"
	ModeWatermill = "watermill"
	// ModeConnectJDBC is Kafka Connect with the Debezium JDBC sink (see
	// connect.go); it runs on real Kafka only.
	ModeConnectJDBC = "connect-jdbc"
)

// WorkerSpec tells a child process what to run. It travels as JSON in the
// child's --worker flag, except for DatabaseURL.
type WorkerSpec struct {
	Mode        string   `json:"mode"`
	Brokers     []string `json:"brokers"`
	RegistryURL string   `json:"registry_url"`
	// DatabaseURL connects to the run's own schema (search_path) with an
	// application_name that identifies the run's backends. It may hold a
	// password, and a command line is visible to every user of the
	// machine (ps), so it travels in the child's environment
	// (DatabaseURLEnv) instead.
	DatabaseURL string `json:"-"`
	Topic       string `json:"topic"`
	Partitions  int    `json:"partitions"`
	Identity    string `json:"identity"`
	// End is the log-end offset of every partition, when known up front;
	// otherwise the parent sends it later on stdin.
	End map[int32]int64 `json:"end,omitempty"`

	BatchMaxRecords  int           `json:"batch_max_records"`
	BatchMaxWait     time.Duration `json:"batch_max_wait"`
	CommitMaxBatches int           `json:"commit_max_batches"`
	StateCacheRows   int           `json:"state_cache_rows"`
	StateCacheBytes  int64         `json:"state_cache_bytes"`
	MemberMaxRecords int           `json:"member_max_records"`
	// TimeLimit bounds naive and watermill runs: they stop after it and
	// report the prefix they committed.
	TimeLimit time.Duration `json:"time_limit"`
	// Gen and ValueBytes let the limit run regenerate the stream.
	Gen        GenOptions `json:"gen"`
	ValueBytes int        `json:"value_bytes"`
	// CopyConns is how many connections COPY in parallel (limit run).
	CopyConns int `json:"copy_conns"`
	// CPUProfile, when set, is where the child writes a CPU profile of its
	// measured window.
	CPUProfile string `json:"cpu_profile,omitempty"`
	// CommitLog asks the engine child for the time of every batch commit.
	CommitLog bool   `json:"commit_log,omitempty"`
	LogLevel  string `json:"log_level,omitempty"`
	// Connect configures the Kafka Connect peer (ModeConnectJDBC).
	Connect *ConnectSpec `json:"connect,omitempty"`
	// RebuildRate is the rebuild's --rebuild-rate (ModeRebuild,
	// ModeRebuildFreshness): records a second, 0 for no limit.
	RebuildRate int `json:"rebuild_rate,omitempty"`
	// HistoryEnd is where the topic ended before the window
	// (ModeRebuildFreshness): the live generation consumes up to it before
	// the window starts; Rebuild runs a rebuild through the window.
	HistoryEnd map[int32]int64 `json:"history_end,omitempty"`
	Rebuild    bool            `json:"rebuild,omitempty"`
	// RebuildPoll is how often the supervisor looks at the operation
	// (0: rebuild.DefaultPoll, as projector run has it).
	RebuildPoll time.Duration `json:"rebuild_poll,omitempty"`
}

// Commit is one committed engine batch: offsets [From, To) of Partition
// became visible at At (Unix nanoseconds, taken when COMMIT returned).
type Commit struct {
	Partition int32 `json:"p"`
	From      int64 `json:"from"`
	To        int64 `json:"to"`
	At        int64 `json:"at"`
}

// Phases is where the engine's batch transactions spent their time, as seen
// from the client (sums over all batches, seconds).
type Phases struct {
	Batches int64   `json:"batches"`
	Begin   float64 `json:"begin"`
	Load    float64 `json:"load"`
	Plan    float64 `json:"plan"`
	Write   float64 `json:"write"`
	Commit  float64 `json:"commit"`
	// Statements sums, per engine statement, the time from when the
	// client began reading its result to when it had it. In a pipeline the
	// first statement's share includes the wait for the server to start
	// on the pipeline, so this is only a client's-eye view: pg_stat_statements
	// is the authority.
	Statements map[string]float64 `json:"statements_client_observed"`
}

// WorkerResult is what a child reports when its run is over.
type WorkerResult struct {
	// Events counts the events consumed and committed in the window.
	Events int64 `json:"events"`
	// Seconds is the measured window: from the start of consuming (for the
	// engine: Run, including joining the group and claiming partitions)
	// to the commit that reached the last end offset (or the time limit).
	Seconds float64 `json:"seconds"`
	// JoinSeconds is how long the engine took from Run to running a worker
	// for every partition.
	JoinSeconds float64 `json:"join_seconds,omitempty"`
	// CPUSeconds is user+system CPU of the child in the window.
	CPUSeconds float64 `json:"cpu_seconds"`
	// Committed is, per partition, the next offset after the last event
	// committed (naive and watermill stop on a time bound).
	Committed map[int32]int64 `json:"committed,omitempty"`
	// RowWrites counts rows upserted or deleted (engine), to show that
	// many events of one aggregate in one batch became one write.
	RowWrites int64 `json:"row_writes,omitempty"`
	// Fetched counts the records the engine's Kafka client read from
	// fetch responses (engine).
	Fetched int64 `json:"fetched,omitempty"`
	// PeakRSSMB is the child's peak resident set (VmHWM of its own
	// address space, read when the window closes).
	PeakRSSMB float64  `json:"peak_rss_mb"`
	Phases    *Phases  `json:"phases,omitempty"`
	Commits   []Commit `json:"commits,omitempty"`
	TimedOut  bool     `json:"timed_out,omitempty"`
	// Peer says what ran, for a peer that is not this program (which
	// versions, how set up).
	Peer string `json:"peer,omitempty"`
	// Note is what the check found beyond ok or not.
	Note string `json:"note,omitempty"`
	// Rebuild is what the rebuild modes saw of the rebuild.
	Rebuild *RebuildResult `json:"rebuild,omitempty"`
}

// message is one line of the child→parent protocol on the child's stdout.
type wireMsg struct {
	Event  string        `json:"event"` // ready, started, done, error
	Result *WorkerResult `json:"result,omitempty"`
	Error  string        `json:"error,omitempty"`
}

// command is one line of the parent→child protocol on the child's stdin.
type command struct {
	Cmd string          `json:"cmd"` // go, end, exit
	End map[int32]int64 `json:"end,omitempty"`
}

// session is the child's side of the protocol.
type session struct {
	out  *json.Encoder
	outM sync.Mutex
	goC  chan struct{}
	endC chan map[int32]int64
	exit chan struct{}
}

func (s *session) send(m wireMsg) {
	s.outM.Lock()
	defer s.outM.Unlock()
	_ = s.out.Encode(m)
}

// DatabaseURLEnv is the environment variable a child reads
// WorkerSpec.DatabaseURL from.
const DatabaseURLEnv = "PROJECTOR_BENCH_CHILD_DATABASE_URL"

// RunWorker runs one child: it prepares its mode, reports ready, waits for
// "go", runs until its work is done, reports the result, and waits for
// "exit" (so that the parent can read the CPU time of its Postgres
// backends while their connections are still open).
func RunWorker(ctx context.Context, spec WorkerSpec, stdin io.Reader, stdout, stderr io.Writer) error {
	s := &session{out: json.NewEncoder(stdout), goC: make(chan struct{}), endC: make(chan map[int32]int64, 1), exit: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdin)
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		var once, exitOnce sync.Once
		for sc.Scan() {
			var c command
			if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
				continue
			}
			switch c.Cmd {
			case "go":
				once.Do(func() { close(s.goC) })
			case "end":
				s.endC <- c.End
			case "exit":
				exitOnce.Do(func() { close(s.exit) })
			}
		}
		exitOnce.Do(func() { close(s.exit) }) // stdin closed: the parent is gone
	}()
	var level slog.Level
	if spec.LogLevel != "" {
		_ = level.UnmarshalText([]byte(spec.LogLevel))
	} else {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: redact.ReplaceAttr})).With("bench", spec.Mode)
	if err := runMode(ctx, spec, s, log, stderr); err != nil {
		s.send(wireMsg{Event: "error", Error: err.Error()})
		return err
	}
	return nil
}

// runEnv is what every mode gets: its hooks into the protocol.
type runEnv struct {
	spec   WorkerSpec
	s      *session
	log    *slog.Logger
	stderr io.Writer
	// window accounting
	cpu0  float64
	start time.Time
	prof  *os.File
}

// ready reports that setup is over and blocks until the parent says go;
// then the measured window starts.
func (e *runEnv) ready(ctx context.Context) error {
	e.s.send(wireMsg{Event: "ready"})
	select {
	case <-e.s.goC:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.s.exit:
		return errors.New("parent went away before go")
	}
	if e.spec.CPUProfile != "" {
		f, err := os.Create(e.spec.CPUProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("cpu profile: %w", err)
		}
		e.prof = f
	}
	e.cpu0 = cpuSeconds()
	e.start = time.Now()
	return nil
}

// finish closes the measured window at end.
func (e *runEnv) finish(res *WorkerResult, end time.Time) {
	res.CPUSeconds = cpuSeconds() - e.cpu0
	res.PeakRSSMB, _ = procStatusMB("self", "VmHWM:")
	res.Seconds = end.Sub(e.start).Seconds()
	if e.prof != nil {
		pprof.StopCPUProfile()
		e.prof.Close()
		e.prof = nil
		// Beside it, what the process allocated (go tool pprof
		// -sample_index=alloc_space): allocation drives the collector.
		if f, err := os.Create(strings.TrimSuffix(e.spec.CPUProfile, ".pprof") + ".allocs.pprof"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
}

// endOffsets delivers the end offsets: at once when the spec has them,
// otherwise when the parent sends them.
func (e *runEnv) endOffsets() <-chan map[int32]int64 {
	if e.spec.End != nil {
		c := make(chan map[int32]int64, 1)
		c <- e.spec.End
		return c
	}
	return e.s.endC
}

// report sends the result and blocks until the parent has read what it
// needs (the CPU time of this run's Postgres backends, whose connections
// must still be open), then returns so that the mode can clean up.
func (e *runEnv) report(ctx context.Context, res *WorkerResult) {
	e.s.send(wireMsg{Event: "done", Result: res})
	select {
	case <-e.s.exit:
	case <-ctx.Done():
	case <-time.After(2 * time.Minute):
	}
}

func runMode(ctx context.Context, spec WorkerSpec, s *session, log *slog.Logger, stderr io.Writer) error {
	e := &runEnv{spec: spec, s: s, log: log, stderr: stderr}
	switch spec.Mode {
	case ModeLimit, ModeLimitKeyed:
		return runLimit(ctx, e, spec.Mode == ModeLimitKeyed)
	case ModeEngineFold, ModeEngineSnapshot:
		return runEngine(ctx, e)
	case ModeUpsert:
		return runUpsert(ctx, e)
	case ModeNaive:
		return runNaive(ctx, e)
	case ModeWatermill:
		return runWatermill(ctx, e)
	case ModeConnectJDBC:
		return runConnectJDBC(ctx, e)
	case ModeRebuild:
		return runRebuild(ctx, e)
	case ModeRebuildFreshness:
		return runRebuildFreshness(ctx, e)
	}
	return fmt.Errorf("unknown worker mode %q", spec.Mode)
}

// cpuSeconds is the process's user+system CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return tv(ru.Utime) + tv(ru.Stime)
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
