package projector_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

const (
	stormHalted  = "partition halted: dead-letter storm"
	deadLettered = "records dead-lettered"
)

// withKeyField returns copies of projs whose key field is field: a
// mistake in the projection file.
func withKeyField(projs []*projection.Projection, field string) []*projection.Projection {
	out := make([]*projection.Projection, len(projs))
	for i, p := range projs {
		c := *p
		c.KeyField = field
		out[i] = &c
	}
	return out
}

// stormSetup is a stream of a few thousand records, produced, with few
// poison pills.
func stormSetup(t *testing.T, partitions int) *faultBundle {
	t.Helper()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Poison = 400, 3
	f := faultSetup(t, opts, partitions)
	f.produce(t, f.records)
	return f
}

// classLines counts the WARN lines about dead letters of class.
func classLines(t *testing.T, logs *logLines, class string) int {
	t.Helper()
	logs.mu.Lock()
	defer logs.mu.Unlock()
	n := 0
	for line := range bytes.Lines(logs.buf.Bytes()) {
		var rec struct{ Level, Msg, Class string }
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Level == slog.LevelWarn.String() && strings.HasPrefix(rec.Msg, deadLettered) && rec.Class == class {
			n++
		}
	}
	return n
}

// TestDeadLetterStormHaltsPartition runs a projection whose key field is
// wrong, so that every event would be dead-lettered as key_mismatch: each
// partition halts instead, with its stored offset before the batch that
// made the storm and none of that batch's dead letters written;
// projector_partition_dead_letter_storm and /readyz name the class, and
// one error line per partition is all the log says however often the
// batch is tried again. A deploy with the key field fixed resumes from
// the stored offsets, and the table equals the reference fold.
func TestDeadLetterStormHaltsPartition(t *testing.T) {
	const partitions = 2
	ctx := t.Context()
	f := stormSetup(t, partitions)
	good := f.projs
	f.projs = withKeyField(good, "type")

	var logs logLines
	reg := prometheus.NewRegistry()
	e := f.engine(t, "storm", projector.Config{Partition: fastRetry, Registerer: reg, Logger: logs.logger(slog.LevelInfo)})
	stop := run(t, e)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if got := gauge(t, reg, "projector_partition_dead_letter_storm"); got != partitions {
			return fmt.Errorf("projector_partition_dead_letter_storm sums to %v, want %d", got, partitions)
		}
		return nil
	})
	if got := counterWith(t, reg, "projector_partition_dead_letter_storm", "class", sinks.ClassKeyMismatch); got != partitions {
		t.Errorf("projector_partition_dead_letter_storm{class=%q} sums to %v, want %d", sinks.ClassKeyMismatch, got, partitions)
	}
	err := e.Ready(ctx)["partitions"]
	if err == nil || strings.Count(err.Error(), "halted: dead-letter storm") != partitions || !strings.Contains(err.Error(), sinks.ClassKeyMismatch) {
		t.Errorf("/readyz partitions check: %v, want each partition halted by a key_mismatch storm", err)
	}
	// The partitions try again and again, and say so once.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if n := logs.count(t, slog.LevelError, stormHalted); n != partitions {
			return fmt.Errorf("%d error lines saying a partition halted, want one per partition (%d)", n, partitions)
		}
		return nil
	})
	lines := logs.lines()
	retries := counterWith(t, reg, "projector_retries_total", "reason", "dead_letter_storm")
	testenv.WaitFor(t, 20*time.Second, func() error {
		if n := counterWith(t, reg, "projector_retries_total", "reason", "dead_letter_storm"); n < retries+5*partitions {
			return fmt.Errorf("%v storm retries, want %v", n, retries+5*partitions)
		}
		return nil
	})
	if more := logs.lines() - lines; more > 0 {
		t.Errorf("%d more log lines while halted, want none", more)
	}
	// The records of the first batch or two may have been dead-lettered
	// before the guard judged (it waits for 100 records); beyond them,
	// nothing moved.
	dead := deadLetters(t, f.db.Pool)
	stored, _, err := demo.Committed(ctx, f.db.Pool, "storm", demo.Topic, f.end)
	if err != nil {
		t.Fatal(err)
	}
	if dead >= 100*partitions || stored >= 100*partitions || int64(dead) > stored {
		t.Errorf("halted with %d records committed and %d dead letters, want fewer than the 100 per partition the guard waits for", stored, dead)
	}
	stop()
	if got := gauge(t, reg, "projector_partition_dead_letter_storm"); got != 0 {
		t.Errorf("projector_partition_dead_letter_storm sums to %v after the member left: its partitions are no longer its to report", got)
	}

	// The fix is a deploy: the same identity with the right key field.
	f.projs = good
	run(t, f.engine(t, "storm", projector.Config{Partition: fastRetry}))
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, f.db.Pool, "storm", demo.Topic, f.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(f.records)
	if dead == 0 {
		if err := demo.Verify(ctx, f.db.Pool, demo.Table, exp); err != nil {
			t.Fatal(err)
		}
		checkCounts(t, f.db.Pool, "storm", exp)
	} else {
		t.Logf("%d events were dead-lettered before the guard judged: the table is not compared with the fold", dead)
	}
}

// TestDeadLetterStormOff: with the guard off, the same mistake
// dead-letters every event and the offsets move to the end, as they did
// before the guard; the log says so once per partition, not once per
// record.
func TestDeadLetterStormOff(t *testing.T) {
	const partitions = 2
	f := stormSetup(t, partitions)
	f.projs = withKeyField(f.projs, "type")
	var logs logLines
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.DeadLetterStormShare = -1
	run(t, f.engine(t, "flood", projector.Config{Partition: cfg, Registerer: reg, Logger: logs.logger(slog.LevelInfo)}))
	wctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, f.db.Pool, "flood", demo.Topic, f.end, nil); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, r := range f.records {
		if !r.Tombstone {
			want++
		}
	}
	if n := deadLetters(t, f.db.Pool); n != want {
		t.Errorf("%d dead letters, want every one of the %d records with a value", n, want)
	}
	if n := logs.count(t, slog.LevelError, stormHalted); n != 0 {
		t.Errorf("%d storm lines with the guard off", n)
	}
	if got := gauge(t, reg, "projector_partition_dead_letter_storm"); got != 0 {
		t.Errorf("projector_partition_dead_letter_storm sums to %v with the guard off", got)
	}
	if n := classLines(t, &logs, sinks.ClassKeyMismatch); n != partitions {
		t.Errorf("%d warnings of key_mismatch dead letters for %d of them, want one per partition (%d)", n, want, partitions)
	}
}

// TestPoisonPillsDoNotMakeAStorm: a stream with 1% poison pills is
// applied as the reference fold says, its poison pills dead-lettered,
// without a halt; the log has one line per partition for them, not one
// per record.
func TestPoisonPillsDoNotMakeAStorm(t *testing.T) {
	const partitions = 2
	opts := demo.DefaultOptions()
	opts.Aggregates = 1000
	b := faultSetup(t, opts, partitions)
	b.records = demo.Generate(opts)
	opts.Poison = len(b.records) / 100
	b.records = demo.Generate(opts)
	b.produce(t, b.records)
	var logs logLines
	reg := prometheus.NewRegistry()
	run(t, b.engine(t, "pills", projector.Config{Partition: fastRetry, Registerer: reg, Logger: logs.logger(slog.LevelInfo)}))
	b.verify(t, "pills")
	if n := logs.count(t, slog.LevelError, stormHalted); n != 0 {
		t.Errorf("%d storm lines for 1%% poison pills", n)
	}
	if n := classLines(t, &logs, sinks.ClassDecode); n != partitions {
		t.Errorf("%d warnings of decode dead letters for %d poison pills, want one per partition (%d)", n, opts.Poison, partitions)
	}
}

// TestDeadLetterStormHealsWhenTheSchemaArrives: producers write with a
// schema the registry does not have yet, so every record would be
// dead-lettered as decode once its attempts run out: the partition halts
// instead, and resumes by itself once the schema is registered, every
// record applied and none dead-lettered.
func TestDeadLetterStormHealsWhenTheSchemaArrives(t *testing.T) {
	ctx := t.Context()
	opts := demo.Options{Aggregates: 100, MeanEvents: 5, Seed: 7}
	f := faultSetup(t, opts, 1)
	for i := range f.records {
		f.records[i].Event.V2 = false
	}
	const lateID = 950
	prod := f.kafkaClient(t)
	recs := make([]*kgo.Record, 0, len(f.records))
	for _, r := range f.records {
		value, err := f.enc.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if value != nil {
			binary.BigEndian.PutUint32(value[1:5], lateID) // written with a schema not registered yet
		}
		recs = append(recs, &kgo.Record{Topic: f.kafka.Topic, Key: []byte(r.Key), Value: value})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.end, err = demo.EndOffsets(ctx, kadm.NewClient(prod), f.kafka.Topic); err != nil {
		t.Fatal(err)
	}

	var logs logLines
	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.MaxAttempts = 2
	e := f.engine(t, "late", projector.Config{Partition: cfg, Registerer: reg, Logger: logs.logger(slog.LevelInfo)})
	run(t, e)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if got := counterWith(t, reg, "projector_partition_dead_letter_storm", "class", sinks.ClassDecode); got != 1 {
			return fmt.Errorf("projector_partition_dead_letter_storm{class=decode} = %v, want 1", got)
		}
		return nil
	})
	if err := e.Ready(ctx)["partitions"]; err == nil || !strings.Contains(err.Error(), "as decode") || !strings.Contains(err.Error(), "950") {
		t.Errorf("/readyz partitions check: %v, want the partition halted by a decode storm naming the schema id", err)
	}
	if n := deadLetters(t, f.db.Pool); n != 0 {
		t.Fatalf("%d dead letters before the guard judged, want none: the records came in one fetch", n)
	}

	ids, err := f.reg.SchemaByVersion(ctx, f.kafka.Topic+"-value", 1)
	if err != nil {
		t.Fatal(err)
	}
	f.fake.SeedSchema(f.kafka.Topic+"-value", 90, lateID, ids.Schema)
	f.verify(t, "late")
	testenv.WaitFor(t, 10*time.Second, func() error {
		if got := gauge(t, reg, "projector_partition_dead_letter_storm"); got != 0 {
			return fmt.Errorf("projector_partition_dead_letter_storm sums to %v after the schema came", got)
		}
		if err := e.Ready(ctx)["partitions"]; err != nil {
			return err
		}
		if n := logs.count(t, slog.LevelInfo, "partition resumed"); n != 1 {
			return errors.New("no line saying the partition resumed")
		}
		return nil
	})
	if n := logs.count(t, slog.LevelError, stormHalted); n != 1 {
		t.Errorf("%d error lines saying the partition halted, want 1", n)
	}
}
