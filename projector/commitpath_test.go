package projector_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
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
// one error line each, projector_partition_halted and /readyz say so,
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
	if got := gauge(t, reg, "projector_partition_halted"); got != partitions {
		t.Errorf("projector_partition_halted sums to %v, want %d", got, partitions)
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
		if got := gauge(t, reg, "projector_partition_halted"); got != 0 {
			return fmt.Errorf("projector_partition_halted sums to %v after the column came back", got)
		}
		return e.Ready(ctx)["partitions"]
	})
	if n := logs.count(t, slog.LevelInfo, "partition resumed"); n != partitions {
		t.Errorf("%d lines saying a partition resumed, want %d", n, partitions)
	}
}
