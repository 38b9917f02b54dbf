package projector_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
)

// TestFirstClaimListsOffsetsOnce has one member claim many partitions
// that have no stored offset: their start offsets must be resolved
// together, not by listing the whole topic once per partition, and each
// partition is claimed once. The table then equals the reference fold.
func TestFirstClaimListsOffsetsOnce(t *testing.T) {
	const partitions = 240
	opts := demo.DefaultOptions()
	opts.Aggregates = 600
	b := setup(t, opts, partitions)

	var listed, listedPartitions atomic.Int64
	b.kafka.Fake.ControlKey(int16(kmsg.ListOffsets), func(r kmsg.Request) (kmsg.Response, error, bool) {
		listed.Add(1)
		for _, tp := range r.(*kmsg.ListOffsetsRequest).Topics {
			listedPartitions.Add(int64(len(tp.Partitions)))
		}
		return nil, nil, false
	})
	e := b.engine(t, "fresh", projector.Config{})
	run(t, e)
	testenv.WaitFor(t, 60*time.Second, func() error {
		if n := len(e.Workers()); n != partitions {
			return fmt.Errorf("%d of %d partitions claimed", n, partitions)
		}
		return nil
	})
	b.verify(t, "fresh")

	// One request per broker (the test cluster has one); a few more leave
	// room for a retried one.
	if n := listed.Load(); n > 3 {
		t.Errorf("claiming %d fresh partitions sent %d ListOffsets requests listing %d partitions, want one request",
			partitions, n, listedPartitions.Load())
	}
	var claimedTwice int
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_offsets WHERE identity = 'fresh' AND owner_epoch <> 1`).Scan(&claimedTwice); err != nil {
		t.Fatal(err)
	}
	if claimedTwice != 0 {
		t.Errorf("%d partitions were claimed more than once by the only member", claimedTwice)
	}
}

// logRecords is a slog handler that keeps the messages of the records it
// handles, so that a test can count them.
type logRecords struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newLogRecords() logRecords { return logRecords{mu: &sync.Mutex{}, msgs: &[]string{}} }

func (l logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l logRecords) WithGroup(string) slog.Handler            { return l }
func (l logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.msgs = append(*l.msgs, r.Level.String()+" "+r.Message)
	return nil
}

// count returns how many records had a message starting with prefix
// ("ERROR partition halted"), and how many records there were in all.
func (l logRecords) count(prefix string) (n, all int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range *l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n, len(*l.msgs)
}

// opened is an AccountOpened event for accounts prefix-from to prefix-(to-1).
func opened(prefix string, from, to int) []demo.Record {
	var out []demo.Record
	for i := from; i < to; i++ {
		id := prefix + strconv.Itoa(i)
		out = append(out, demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "o"}})
	}
	return out
}

// produceTo writes records to one partition of the demo topic.
func (b *bundle) produceTo(t *testing.T, p int32, records []demo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, r := range records {
		value, err := b.enc.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: b.kafka.Topic, Partition: p, Key: []byte(r.Key), Value: value}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if b.end, err = demo.EndOffsets(t.Context(), kadm.NewClient(cl), b.kafka.Topic); err != nil {
		t.Fatal(err)
	}
}

// fetchWatch counts the Fetch requests that ask for a partition of the
// demo topic, and the ListOffsets requests.
type fetchWatch struct {
	partition int32
	// quiet counts the Fetch requests since the last one that asked for
	// the partition.
	quiet, asked, listed atomic.Int64
}

func watchFetches(b *bundle, p int32) *fetchWatch {
	w := &fetchWatch{partition: p}
	b.kafka.Fake.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		for _, tp := range r.(*kmsg.FetchRequest).Topics {
			for _, fp := range tp.Partitions {
				if fp.Partition == w.partition {
					w.asked.Add(1)
					w.quiet.Store(0)
					return nil, nil, false
				}
			}
		}
		w.quiet.Add(1)
		return nil, nil, false
	})
	b.kafka.Fake.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		w.listed.Add(1)
		return nil, nil, false
	})
	return w
}

// haltedQuietly waits until e halted partition p, and then until the
// client has stopped asking for it while it goes on fetching the others
// (a fetch session would leave unchanged partitions out of the requests:
// the engine runs without them).
func haltedQuietly(t *testing.T, e *projector.Engine, w *fetchWatch, lines logRecords) partition.Status {
	t.Helper()
	var halted partition.Status
	testenv.WaitFor(t, 30*time.Second, func() error {
		for _, s := range e.Workers() {
			if s.Partition == w.partition && s.Halted != "" {
				halted = s
				return nil
			}
		}
		return fmt.Errorf("partition %d not halted", w.partition)
	})
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := w.quiet.Load(); n < 20 {
			errs, all := lines.count("ERROR")
			return fmt.Errorf("partition %d halted, yet still fetched: %d fetches of it, the last %d fetches since without it; %d error lines of %d",
				w.partition, w.asked.Load(), n, errs, all)
		}
		return nil
	})
	return halted
}

func haltedGauge(t *testing.T, reg prometheus.Gatherer, reason string) float64 {
	t.Helper()
	var v float64
	for _, m := range metrics(t, reg, "projector_partition_halted") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" && l.GetValue() == reason {
				v += m.GetGauge().GetValue()
			}
		}
	}
	return v
}

var noFetchSessions = []kgo.Opt{kgo.DisableFetchSessions()}

// TestHaltedPartitionIsQuiet deletes records beyond a partition's stored
// offset, as retention would: the partition halts, its fetching pauses,
// the error is logged once and the broker is not asked about it again,
// while the gauge and /readyz keep saying so and the other partition
// goes on.
func TestHaltedPartitionIsQuiet(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 2)
	f.produceTo(t, 0, opened("p0-", 0, 10))
	f.produceTo(t, 1, opened("p1-", 0, 10))
	stop := run(t, f.engine(t, "quiet", projector.Config{}))
	f.verifyPart(t, "quiet", append(opened("p0-", 0, 10), opened("p1-", 0, 10)...))
	stop()

	f.produceTo(t, 0, opened("p0-", 10, 30))
	f.kafka.DeleteRecords(f.kafka.Topic, 0, 20)
	w := watchFetches(f.bundle, 0)
	lines := newLogRecords()
	reg := prometheus.NewRegistry()
	e := f.engine(t, "quiet", projector.Config{Registerer: reg, Logger: slog.New(lines), ClientOpts: noFetchSessions})
	run(t, e)
	halted := haltedQuietly(t, e, w, lines)
	listed := w.listed.Load()

	// The other partition is not held up.
	f.produceTo(t, 1, opened("p1-", 10, 20))
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n, _, _ := demo.Committed(ctx, f.db.Pool, "quiet", f.kafka.Topic, nil); n != 10+20 {
			return fmt.Errorf("%d records committed, want 30", n)
		}
		return nil
	})
	if n, all := lines.count("ERROR partition halted"); n != 1 {
		t.Errorf("%d 'partition halted' error lines (of %d lines), want exactly one", n, all)
	}
	if n := listed; n > 2 {
		t.Errorf("%d ListOffsets requests for one halted partition, want the two that list its bounds", n)
	}
	if !strings.Contains(halted.Halted, "deleted by retention") || !strings.Contains(halted.Halted, "--on-offset-lost=skip") {
		t.Errorf("halt reason %q: want it to say records were deleted and how to continue", halted.Halted)
	}
	if err := e.Ready(ctx)["partitions"]; err == nil || !strings.Contains(err.Error(), "halted") {
		t.Errorf("/readyz partitions check: %v, want the halted partition", err)
	}
	if got := haltedGauge(t, reg, "records_deleted"); got != 1 {
		t.Errorf(`projector_partition_halted{reason="records_deleted"} = %v, want 1`, got)
	}
	// Its oldest record not committed is gone: its age counts from the
	// halt's start, not 0 as for a partition caught up.
	before := time.Since(halted.HaltedSince).Seconds()
	age, ok := partitionGauge(t, reg, "projector_consumer_lag_seconds", 0)
	if after := time.Since(halted.HaltedSince).Seconds(); !ok || age < before || age > after || age <= 0 {
		t.Errorf("projector_consumer_lag_seconds of the halted partition = %v (exported: %v), want the time since the halt began, %.3f to %.3f", age, ok, before, after)
	}
	if err := demo.Verify(ctx, f.db.Pool, demo.Table, demo.Fold(append(opened("p0-", 0, 10), opened("p1-", 0, 20)...))); err != nil {
		t.Error(err)
	}
}

// TestOffsetBeyondLogEnd deletes and creates the topic again while no
// member runs, so the stored offsets lie past the new log's end: the
// partition halts with its own reason and advice, even with
// OnOffsetLost skip (which cannot help), quietly.
func TestOffsetBeyondLogEnd(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 2)
	f.produceTo(t, 0, opened("old-", 0, 10))
	stop := run(t, f.engine(t, "recreated", projector.Config{}))
	f.verifyPart(t, "recreated", opened("old-", 0, 10))
	stop()

	f.kafka.DeleteTopic(f.kafka.Topic)
	f.kafka.CreateTopic(f.kafka.Topic, 2, nil)
	f.produceTo(t, 0, opened("new-", 0, 3))
	w := watchFetches(f.bundle, 0)
	lines := newLogRecords()
	reg := prometheus.NewRegistry()
	e := f.engine(t, "recreated", projector.Config{OnOffsetLost: projector.OffsetLostSkip, Registerer: reg, Logger: slog.New(lines), ClientOpts: noFetchSessions})
	run(t, e)
	halted := haltedQuietly(t, e, w, lines)

	for _, want := range []string{"beyond the log end 3", "created again", "--on-offset-lost=skip does not apply", "projector offsets reset --topic " + f.kafka.Topic + " --partitions 0"} {
		if !strings.Contains(halted.Halted, want) {
			t.Errorf("halt reason %q lacks %q", halted.Halted, want)
		}
	}
	if strings.Contains(halted.Halted, "deleted by retention") {
		t.Errorf("halt reason %q blames retention", halted.Halted)
	}
	if n, all := lines.count("ERROR partition halted: stored offset is beyond the log end"); n != 1 {
		t.Errorf("%d 'beyond the log end' error lines (of %d lines), want exactly one", n, all)
	}
	if got := haltedGauge(t, reg, "beyond_log_end"); got != 1 {
		t.Errorf(`projector_partition_halted{reason="beyond_log_end"} = %v, want 1`, got)
	}
	for _, m := range metrics(t, reg, "projector_consumer_lag") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "partition" && l.GetValue() == "0" {
				t.Errorf("projector_consumer_lag of partition 0 = %v: a stored offset past the log end has no lag to tell", m.GetGauge().GetValue())
			}
		}
	}
	if n, _, _ := demo.Committed(ctx, f.db.Pool, "recreated", f.kafka.Topic, nil); n != 10 {
		t.Errorf("stored offsets sum to %d, want the 10 stored before: nothing skipped", n)
	}
	if err := demo.Verify(ctx, f.db.Pool, demo.Table, demo.Fold(opened("old-", 0, 10))); err != nil {
		t.Error(err)
	}
}

// TestHaltedPartitionListsBoundsAgain has the broker refuse to list the
// log's bounds when a partition's stored offset is found out of range:
// the partition halts quietly for an unknown reason, lists them again
// after a while, and then halts for the real one.
func TestHaltedPartitionListsBoundsAgain(t *testing.T) {
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 2)
	f.produceTo(t, 0, opened("p0-", 0, 10))
	stop := run(t, f.engine(t, "relist", projector.Config{}))
	f.verifyPart(t, "relist", opened("p0-", 0, 10))
	stop()
	f.produceTo(t, 0, opened("p0-", 10, 30))
	f.kafka.DeleteRecords(f.kafka.Topic, 0, 20)

	var refuse atomic.Bool
	refuse.Store(true)
	f.kafka.Fake.ControlKey(int16(kmsg.ListOffsets), func(r kmsg.Request) (kmsg.Response, error, bool) {
		f.kafka.Fake.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		req := r.(*kmsg.ListOffsetsRequest)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	w := watchFetches(f.bundle, 0)
	lines := newLogRecords()
	reg := prometheus.NewRegistry()
	e := f.engine(t, "relist", projector.Config{Registerer: reg, Logger: slog.New(lines), ClientOpts: noFetchSessions})
	run(t, e)
	halted := haltedQuietly(t, e, w, lines)
	if !strings.Contains(halted.Halted, "could not be listed") || haltedGauge(t, reg, "unknown") != 1 {
		t.Errorf("halted with the bounds unknown: reason %q, gauge %v; want it to say they could not be listed", halted.Halted, haltedGauge(t, reg, "unknown"))
	}
	refuse.Store(false)
	testenv.WaitFor(t, 3*projector.ResetCheckInterval, func() error {
		if haltedGauge(t, reg, "records_deleted") != 1 || haltedGauge(t, reg, "unknown") != 0 {
			return fmt.Errorf("still halted for an unknown reason: %+v", e.Workers())
		}
		return nil
	})
	for _, s := range e.Workers() {
		if s.Partition == 0 && !strings.Contains(s.Halted, "deleted by retention") {
			t.Errorf("halt reason after listing again: %q", s.Halted)
		}
	}
	if n, all := lines.count("ERROR partition halted"); n != 2 {
		t.Errorf("%d 'partition halted' error lines (of %d), want two: the unknown reason, then the real one", n, all)
	}
	if err := demo.Verify(t.Context(), f.db.Pool, demo.Table, demo.Fold(opened("p0-", 0, 10))); err != nil {
		t.Error(err)
	}
}
