package projector_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

// logLines collects the JSON log lines of an engine.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// logger logs at level and above into l.
func (l *logLines) logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: level}))
}

// count returns how many lines at level have a message starting with msg.
func (l *logLines) count(t *testing.T, level slog.Level, msg string) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range bytes.Lines(l.buf.Bytes()) {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Level == level.String() && strings.HasPrefix(rec.Msg, msg) {
			n++
		}
	}
	return n
}

// lines returns how many lines were logged.
func (l *logLines) lines() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Count(l.buf.Bytes(), []byte("\n"))
}

// TestStatementRefusedHaltsPartition renames a column of the table
// mid-stream, so that Postgres refuses the statements projector writes
// with (SQLSTATE 42703): every partition halts after a few attempts with
// one error line each, projector_partition_statements_refused and
// /readyz say so,
// nothing is dead-lettered and the log stays quiet. Once the column is
// back, the partitions resume by themselves and the table ends equal to
// the reference fold.
func TestStatementRefusedHaltsPartition(t *testing.T) {
	const partitions = 3
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 600
	f := faultSetup(t, opts, partitions)
	half := len(f.records) / 2
	f.produce(t, f.records[:half])

	var logs logLines
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.RetryCap = 500 * time.Millisecond
	e := f.engine(t, "refused", projector.Config{Partition: cfg, Registerer: reg, Logger: logs.logger(slog.LevelInfo)})
	run(t, e)
	f.verifyPart(t, "refused", f.records[:half])

	if _, err := f.db.Pool.Exec(ctx, `ALTER TABLE accounts RENAME COLUMN owner TO owner_name`); err != nil {
		t.Fatal(err)
	}
	f.produce(t, f.records[half:])
	testenv.WaitFor(t, 30*time.Second, func() error {
		halted := 0
		for _, s := range e.Workers() {
			if s.Halted != "" {
				halted++
			}
		}
		if halted < partitions {
			return fmt.Errorf("%d of %d partitions halted (%.0f retries so far)", halted, partitions, counter(t, reg, "projector_retries_total"))
		}
		return nil
	})
	err := e.Ready(ctx)["partitions"]
	if err == nil || !strings.Contains(err.Error(), "halted") || !strings.Contains(err.Error(), "SQLSTATE 42703") {
		t.Errorf("/readyz partitions check: %v, want each partition halted with Postgres's error", err)
	}
	for _, s := range e.Workers() {
		if s.HaltKind != sinks.HaltStatementsRefused || s.HaltedSince.IsZero() {
			t.Errorf("partition %d halted as %q since %v, want %q and when", s.Partition, s.HaltKind, s.HaltedSince, sinks.HaltStatementsRefused)
		}
	}
	if got := gauge(t, reg, "projector_partition_statements_refused"); got != partitions {
		t.Errorf("projector_partition_statements_refused sums to %v, want %d", got, partitions)
	}
	if n := logs.count(t, slog.LevelError, "partition halted"); n != partitions {
		t.Errorf("%d error lines saying a partition halted, want one per partition (%d)", n, partitions)
	}
	if n, want := deadLetters(t, f.db.Pool), demo.Fold(f.records[:half]).Poison; n != want {
		t.Errorf("%d dead letters, want only the poison pills of the first half (%d): a refused statement is not the records' fault", n, want)
	}
	// Halted, a partition tries again now and then, without a line each
	// time.
	lines := logs.lines()
	retries := counter(t, reg, "projector_retries_total")
	testenv.WaitFor(t, 10*time.Second, func() error {
		if counter(t, reg, "projector_retries_total") < retries+partitions {
			return errors.New("no further attempt while halted")
		}
		return nil
	})
	if more := logs.lines() - lines; more > 0 {
		t.Errorf("%d more log lines while halted, want none", more)
	}

	if _, err := f.db.Pool.Exec(ctx, `ALTER TABLE accounts RENAME COLUMN owner_name TO owner`); err != nil {
		t.Fatal(err)
	}
	f.verify(t, "refused")
	testenv.WaitFor(t, 10*time.Second, func() error {
		if got := gauge(t, reg, "projector_partition_statements_refused"); got != 0 {
			return fmt.Errorf("projector_partition_statements_refused sums to %v after the column came back", got)
		}
		return e.Ready(ctx)["partitions"]
	})
	if n := logs.count(t, slog.LevelInfo, "partition resumed"); n != partitions {
		t.Errorf("%d lines saying a partition resumed, want %d", n, partitions)
	}
}

// TestStalledPartitionFailsLiveness holds the stored offsets' rows locked
// while records arrive, so that every commit waits for good (as behind a
// deadlock or a connection that never answers): each partition is
// reported stalled once, in an error line and projector_partition_stalled,
// and /livez fails so that Kubernetes would restart the member. Once the
// lock goes, the partitions commit again, /livez passes and the table
// equals the reference fold.
func TestStalledPartitionFailsLiveness(t *testing.T) {
	const partitions = 2
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 400
	f := faultSetup(t, opts, partitions)
	half := len(f.records) / 2
	f.produce(t, f.records[:half])

	var logs logLines
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.StallAfter = time.Second
	e := f.engine(t, "stall", projector.Config{Partition: cfg, Registerer: reg, Logger: logs.logger(slog.LevelInfo)})
	srv := httptest.NewServer(projector.Handler(reg, e.Ready, e.Live))
	defer srv.Close()
	run(t, e)
	f.verifyPart(t, "stall", f.records[:half])
	if code, body := get(t, srv.URL+"/livez"); code != http.StatusOK {
		t.Fatalf("/livez of a member keeping up: %d %q", code, body)
	}

	lock, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back below
	if _, err := lock.Exec(ctx, `SELECT * FROM projector_offsets WHERE identity = 'stall' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	f.produce(t, f.records[half:])
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, body := get(t, srv.URL+"/livez")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "committed nothing") {
			return fmt.Errorf("/livez: %d %q, want 503 naming the stalled partitions", code, body)
		}
		if got := gauge(t, reg, "projector_partition_stalled"); got != partitions {
			return fmt.Errorf("projector_partition_stalled sums to %v, want %d", got, partitions)
		}
		return nil
	})
	// Stalled for many more of the engine's looks: said once per
	// partition all the same.
	stalledAt := time.Now()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if e.Live(ctx)["partitions"] == nil {
			t.Fatal("no longer stalled while the lock holds")
		}
		if time.Since(stalledAt) < 3*cfg.StallAfter {
			return errors.New("stalled for less than three times --stall-after")
		}
		return nil
	})
	if n := logs.count(t, slog.LevelError, "partition stalled"); n != partitions {
		t.Errorf("%d error lines saying a partition stalled, want one per partition (%d)", n, partitions)
	}

	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	f.verify(t, "stall")
	testenv.WaitFor(t, 10*time.Second, func() error {
		if code, body := get(t, srv.URL+"/livez"); code != http.StatusOK {
			return fmt.Errorf("/livez after the lock went: %d %q", code, body)
		}
		if got := gauge(t, reg, "projector_partition_stalled"); got != 0 {
			return fmt.Errorf("projector_partition_stalled sums to %v after the lock went", got)
		}
		return nil
	})
}

// TestCommitReplyLostKeepsWorker cuts the member's connection between
// COMMIT and its reply, for several batches, and once more with Postgres
// out of reach for a while after the cut: no worker takes its own commit
// for a newer owner's, every partition keeps going, and the table equals
// the reference fold, nothing applied twice.
func TestCommitReplyLostKeepsWorker(t *testing.T) {
	const partitions = 3
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 1000
	f := faultSetup(t, opts, partitions)
	half := len(f.records) / 2
	f.produce(t, f.records[:half])

	proxy := testenv.StartPGProxy(t, f.db.URL)
	pool, err := pgxpool.New(ctx, proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the engine has stopped: Close waits for the connections it holds
	through := *f.bundle
	through.db = &testenv.DB{Pool: pool, URL: proxy.URL, Schema: f.db.Schema}
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.BatchMaxRecords = 50
	e := through.engine(t, "lost", projector.Config{Partition: cfg, Registerer: reg})

	const drops = 5
	proxy.DropCommitReplies(drops, false)
	run(t, e)
	notFenced := func() {
		if n := counter(t, reg, "projector_fenced_batches_total"); n > 0 {
			t.Fatalf("%v batches taken for a newer owner's after a lost COMMIT reply; %d workers left of %d", n, len(e.Workers()), partitions)
		}
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		notFenced()
		if proxy.Dropped() < drops {
			return fmt.Errorf("%d of %d COMMIT replies dropped", proxy.Dropped(), drops)
		}
		return nil
	})
	f.verifyPart(t, "lost", f.records[:half])
	notFenced()

	// Once more, with Postgres out of reach until the batch has been
	// retried: the retry asks first whether the commit landed.
	proxy.DropCommitReplies(1, true)
	retries := counter(t, reg, "projector_retries_total")
	f.produce(t, f.records[half:])
	testenv.WaitFor(t, 30*time.Second, func() error {
		if proxy.Dropped() < drops+1 || counter(t, reg, "projector_retries_total") < retries+3 {
			return fmt.Errorf("%d COMMIT replies dropped, %.0f retries since", proxy.Dropped(), counter(t, reg, "projector_retries_total")-retries)
		}
		return nil
	})
	proxy.Accept()
	f.verify(t, "lost")
	notFenced()
	if n := len(e.Workers()); n != partitions {
		t.Errorf("%d workers running, want %d", n, partitions)
	}
}

// TestDuplicatesAfterRestartOnSmallPool restarts a member, its state
// cache empty, on a pool of two connections for eight partitions, behind
// a stream that sends again the first event of every account it applied:
// nearly every batch's insert of an account it takes for new fails on
// the primary key, on many partitions at once. The member must not stop
// on its own pool; the table ends equal to the reference fold.
func TestDuplicatesAfterRestartOnSmallPool(t *testing.T) {
	const partitions = 8
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 1600
	opts.Duplicate, opts.Reorder, opts.GapEvery, opts.Poison = 0, 0, 0, 0
	b := faultSetup(t, opts, partitions).bundle
	all := b.records
	half := len(all) / 2
	b.produce(t, all[:half])
	stop := run(t, b.engine(t, "smallpool", projector.Config{}))
	b.verifyPart(t, "smallpool", all[:half])
	stop()

	var resent []demo.Record
	for _, r := range all[:half] {
		if r.Event.Version == 1 {
			resent = append(resent, r)
		}
	}
	rest := append(resent, all[half:]...)
	b.produce(t, rest)
	b.records = append(all[:half:half], rest...)

	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the engine has stopped: Close waits for the connections it holds
	small := *b
	small.db = &testenv.DB{Pool: pool, URL: b.db.URL, Schema: b.db.Schema}
	cfg := fastRetry
	cfg.BatchMaxRecords = 20
	reg := prometheus.NewRegistry()
	run(t, small.engine(t, "smallpool", projector.Config{Partition: cfg, Registerer: reg}))
	testenv.WaitFor(t, time.Minute, func() error {
		n, done, err := demo.Committed(ctx, b.db.Pool, "smallpool", b.kafka.Topic, b.end)
		if err != nil || !done {
			return fmt.Errorf("%d of %d records committed (err %v)", n, len(b.records), err)
		}
		return nil
	})
	b.verify(t, "smallpool")
	if n := counter(t, reg, "projector_commit_replays_total"); n == 0 {
		t.Error("no transaction met an account it took for new: the test did not make the conflicts")
	}
}
