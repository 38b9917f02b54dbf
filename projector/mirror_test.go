package projector_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
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

// admin is a Kafka admin client of b's cluster, closed when the test ends.
func (b *bundle) admin(t *testing.T) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// groupOffsets returns the offsets committed to group, by partition of
// b's topic.
func (b *bundle) groupOffsets(ctx context.Context, adm *kadm.Client, group string) (map[int32]int64, error) {
	res, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	if err := res.Error(); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for p, o := range res[b.kafka.Topic] {
		out[p] = o.At
	}
	return out, nil
}

// kadmLag is the lag of group on b's topic by partition, as kadm works it
// out from the group's commits and the partitions' end offsets.
func (b *bundle) kadmLag(ctx context.Context, adm *kadm.Client, group string) (map[int32]int64, error) {
	lags, err := adm.Lag(ctx, group)
	if err != nil {
		return nil, err
	}
	l, ok := lags[group]
	if !ok {
		return nil, fmt.Errorf("group %s not described", group)
	}
	if err := l.Error(); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for p, ml := range l.Lag[b.kafka.Topic] {
		if ml.Err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, ml.Err)
		}
		out[p] = ml.Lag
	}
	return out, nil
}

// toolLag is the LAG column of Kafka's own kafka-consumer-groups
// --describe for group, by partition of b's topic; ok is false when the
// tool cannot be run (no command to run it with).
func (b *bundle) toolLag(t *testing.T, group string) (lag map[int32]int64, ok bool, err error) {
	t.Helper()
	kafka := os.Getenv(testenv.KafkaControlEnv)
	if kafka == "" {
		return nil, false, nil
	}
	out, err := exec.CommandContext(t.Context(), kafka, "tool", "consumer-groups",
		"--bootstrap-server", b.kafka.Brokers(), "--describe", "--group", group).CombinedOutput()
	if err != nil {
		return nil, true, fmt.Errorf("kafka-consumer-groups --describe: %w\n%s", err, out)
	}
	lag, err = parseDescribe(out, b.kafka.Topic)
	if err != nil {
		return nil, true, fmt.Errorf("%w\n%s", err, out)
	}
	return lag, true, nil
}

// parseDescribe reads the LAG column of kafka-consumer-groups --describe
// output, by partition of topic. The columns are found by the header's
// names, so that the tool's other columns may come and go.
func parseDescribe(out []byte, topic string) (map[int32]int64, error) {
	lag := map[int32]int64{}
	col := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if slices.Contains(f, "LAG") && slices.Contains(f, "PARTITION") {
			for i, name := range f {
				col[name] = i
			}
			continue
		}
		if len(col) == 0 || len(f) <= col["LAG"] || f[col["TOPIC"]] != topic {
			continue
		}
		p, err := strconv.ParseInt(f[col["PARTITION"]], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("PARTITION %q: %w", f[col["PARTITION"]], err)
		}
		n, err := strconv.ParseInt(f[col["LAG"]], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("LAG of partition %d: %q is not a number (no offset committed?)", p, f[col["LAG"]])
		}
		lag[int32(p)] = n
	}
	if len(col) == 0 {
		return nil, fmt.Errorf("no header with PARTITION and LAG columns")
	}
	return lag, nil
}

// engineLag is projector_consumer_lag of b's topic by partition.
func engineLag(t *testing.T, g prometheus.Gatherer, topic string) map[int32]int64 {
	t.Helper()
	out := map[int32]int64{}
	for _, m := range metrics(t, g, "projector_consumer_lag") {
		var tp string
		var p int64 = -1
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "topic":
				tp = l.GetValue()
			case "partition":
				p, _ = strconv.ParseInt(l.GetValue(), 10, 32)
			}
		}
		if tp == topic && p >= 0 {
			out[int32(p)] = int64(m.GetGauge().GetValue())
		}
	}
	return out
}

// TestGroupLagMatchesConsumerLag holds a member's commits to Postgres
// while more records arrive, so that it lags by a known number of records
// per partition: the lag of its Kafka consumer group, as kadm and as
// Kafka's own kafka-consumer-groups (on Apache Kafka) read it, must then
// equal projector_consumer_lag partition by partition, and every one of
// them the records produced since. Released, the member catches up and
// the group's lag is 0.
func TestGroupLagMatchesConsumerLag(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	f := faultSetup(t, opts, 3)
	b := f.bundle
	half := len(b.records) / 2
	b.produce(t, b.records[:half])
	first := maps.Clone(b.end)

	group := b.kafka.Name("mirrorlag")
	reg := prometheus.NewRegistry()
	e := b.engine(t, group, projector.Config{Registerer: reg, KafkaCommitInterval: 100 * time.Millisecond, Partition: fastRetry})
	stop := run(t, e)
	ctx := t.Context()
	if err := demo.WaitCommitted(ctx, b.db.Pool, group, b.kafka.Topic, first, nil); err != nil {
		t.Fatal(err)
	}

	// Writes to the table wait behind this lock: no transaction of the
	// member commits, while it fetches the records produced now.
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // released below; this is for a failed test
	if _, err := tx.Exec(ctx, "LOCK TABLE "+demo.Table+" IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	b.produce(t, b.records[half:])
	want := map[int32]int64{}
	for p, end := range b.end {
		want[p] = end - first[p]
	}

	adm := b.admin(t)
	var got map[int32]int64
	testenv.WaitFor(t, time.Minute, func() error {
		if got = engineLag(t, reg, b.kafka.Topic); !maps.Equal(got, want) {
			return fmt.Errorf("projector_consumer_lag %v, want %v", got, want)
		}
		lag, err := b.kadmLag(ctx, adm, group)
		if err != nil {
			return fmt.Errorf("kadm lag: %w", err)
		}
		if !maps.Equal(lag, want) {
			return fmt.Errorf("group lag (kadm) %v, want %v as projector_consumer_lag", lag, want)
		}
		return nil
	})
	if b.kafka.Real() {
		lag, ok, err := b.toolLag(t, group)
		switch {
		case err != nil:
			t.Fatal(err)
		case !ok:
			t.Logf("kafka-consumer-groups not compared: %s does not name the command that runs it", testenv.KafkaControlEnv)
		case !maps.Equal(lag, want):
			t.Errorf("group lag (kafka-consumer-groups) %v, want %v as projector_consumer_lag", lag, want)
		default:
			t.Logf("lag by partition, alike in projector_consumer_lag, kadm and kafka-consumer-groups: %v", lag)
		}
	}
	if n := counter(t, reg, "projector_kafka_offset_commit_failures_total"); n != 0 {
		t.Errorf("projector_kafka_offset_commit_failures_total %v, want 0", n)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.verify(t, group)
	testenv.WaitFor(t, time.Minute, func() error {
		lag, err := b.kadmLag(ctx, adm, group)
		if err != nil {
			return err
		}
		for p, n := range lag {
			if n != 0 {
				return fmt.Errorf("group lag of partition %d is %d after the member caught up", p, n)
			}
		}
		return nil
	})
	stop()
	// The member committed its last offsets as it left: the group, now
	// empty, shows where Postgres says it is.
	if at, err := b.groupOffsets(ctx, adm, group); err != nil || !maps.Equal(at, b.end) {
		t.Errorf("group offsets after the member left: %v (%v), want the stored ones %v", at, err, b.end)
	}
}

// TestRefusedGroupCommitsAreCountedNotFatal has the broker refuse every
// commit to the group: each is counted, the failures logged once a
// minute (on the member's clock), and the table still ends equal to the
// reference fold. Once the broker accepts them again, the group gets the
// stored offsets.
func TestRefusedGroupCommitsAreCountedNotFatal(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	b := setup(t, opts, 3)
	fake := b.kafka.Embedded("refuses offset commits on cue")
	var refuse atomic.Bool
	refuse.Store(true)
	fake.ControlKey(int16(kmsg.OffsetCommit), func(r kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		req := r.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.GroupAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	logs := newLogRecords()
	reg := prometheus.NewRegistry()
	e := b.engine(t, "refused", projector.Config{Registerer: reg, Logger: slog.New(logs), KafkaCommitInterval: 20 * time.Millisecond})
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	projector.SetMirrorClock(e, func() time.Time { return time.Unix(0, now.Load()) })
	run(t, e)
	b.verify(t, "refused")

	const failed = "WARN committing the stored offsets to the Kafka consumer group failed"
	testenv.WaitFor(t, time.Minute, func() error {
		if n := counter(t, reg, "projector_kafka_offset_commit_failures_total"); n < 5 {
			return fmt.Errorf("%v failures counted, want several", n)
		}
		return nil
	})
	if n, _ := logs.count(failed); n != 1 {
		t.Errorf("%d failure lines within a minute, want 1", n)
	}
	if n := counter(t, reg, "projector_kafka_offset_commits_total"); n != 0 {
		t.Errorf("projector_kafka_offset_commits_total %v while every commit is refused, want 0", n)
	}
	now.Add(int64(time.Minute))
	testenv.WaitFor(t, time.Minute, func() error {
		if n, _ := logs.count(failed); n != 2 {
			return fmt.Errorf("%d failure lines a minute later, want 2", n)
		}
		return nil
	})

	refuse.Store(false)
	adm := b.admin(t)
	testenv.WaitFor(t, time.Minute, func() error {
		at, err := b.groupOffsets(t.Context(), adm, "refused")
		if err != nil {
			return err
		}
		if !maps.Equal(at, b.end) {
			return fmt.Errorf("group offsets %v, want the stored ones %v", at, b.end)
		}
		return nil
	})
	if n := counter(t, reg, "projector_kafka_offset_commit_last_success_timestamp_seconds"); n == 0 {
		t.Error("projector_kafka_offset_commit_last_success_timestamp_seconds is 0 after a commit was accepted")
	}
}

// TestRestartIgnoresGroupOffsets moves the group's offsets while the
// group is empty, one partition behind its stored offset and one ahead:
// a member starting again resumes every partition from Postgres (each
// record is processed once, none is skipped), and then commits the
// stored offsets over the ones moved.
func TestRestartIgnoresGroupOffsets(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	f := faultSetup(t, opts, 3)
	b := f.bundle
	half := len(b.records) / 2
	b.produce(t, b.records[:half])
	first := maps.Clone(b.end)
	group := b.kafka.Name("mirrorrestart")

	e := b.engine(t, group, projector.Config{KafkaCommitInterval: 50 * time.Millisecond})
	stop := run(t, e)
	ctx := t.Context()
	if err := demo.WaitCommitted(ctx, b.db.Pool, group, b.kafka.Topic, first, nil); err != nil {
		t.Fatal(err)
	}
	stop()

	b.produce(t, b.records[half:])
	moved := kadm.Offsets{}
	moved.AddOffset(b.kafka.Topic, 0, 0, -1)                              // behind: everything again
	moved.AddOffset(b.kafka.Topic, 1, first[1]+(b.end[1]-first[1])/2, -1) // ahead: half the new records skipped
	adm := b.admin(t)
	res, err := adm.CommitOffsets(ctx, group, moved)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("move the empty group's offsets: %v", err)
	}

	reg := prometheus.NewRegistry()
	e = b.engine(t, group, projector.Config{Registerer: reg, KafkaCommitInterval: 50 * time.Millisecond})
	run(t, e)
	b.verify(t, group)
	var want int64
	for p, end := range b.end {
		want += end - first[p]
	}
	processed := counter(t, reg, "projector_records_processed_total")
	if int64(processed) != want {
		t.Errorf("the restarted member processed %v records, want the %d produced since it stopped (from the stored offsets, not the group's)", processed, want)
	}
	testenv.WaitFor(t, time.Minute, func() error {
		at, err := b.groupOffsets(ctx, adm, group)
		if err != nil {
			return err
		}
		if !maps.Equal(at, b.end) {
			return fmt.Errorf("group offsets %v, want the stored ones %v", at, b.end)
		}
		return nil
	})
}

// watchGroupOffsets polls the offsets committed to group until the test
// ends, and fails it if one of a partition's ever moves back: each member
// commits only the partitions it owns, so a partition's next owner, which
// resumes from the stored offset, never sees an older one committed over
// its own. check, called once the stream is committed, waits until the
// group holds the stored offsets (end).
func (b *bundle) watchGroupOffsets(t *testing.T, group string) (check func(end map[int32]int64)) {
	t.Helper()
	adm := b.admin(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var back atomic.Pointer[string]
	go func() {
		defer close(done)
		seen := map[int32]int64{}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			at, err := b.groupOffsets(ctx, adm, group)
			for p, o := range at {
				if err == nil && o < seen[p] && back.Load() == nil {
					msg := fmt.Sprintf("the group's offset of partition %d moved back from %d to %d", p, seen[p], o)
					back.Store(&msg)
				}
				seen[p] = max(seen[p], o)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return func(end map[int32]int64) {
		t.Helper()
		testenv.WaitFor(t, time.Minute, func() error {
			at, err := b.groupOffsets(t.Context(), adm, group)
			if err != nil {
				return err
			}
			if !maps.Equal(at, end) {
				return fmt.Errorf("group offsets %v, want the stored ones %v", at, end)
			}
			return nil
		})
		stop()
		if msg := back.Load(); msg != nil {
			t.Error(*msg)
		}
	}
}

// TestGroupCommitsAreCoalesced has a member commit many small
// transactions: the group gets at most one commit per interval (and one
// as the member leaves), not one per transaction, and ends at the stored
// offsets.
func TestGroupCommitsAreCoalesced(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 600
	b := setup(t, opts, 3)
	fake := b.kafka.Embedded("counts the offset commits the broker gets")
	var commits atomic.Int64
	fake.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		commits.Add(1)
		return nil, nil, false
	})
	const every = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	e := b.engine(t, "coalesced", projector.Config{
		Registerer: reg, KafkaCommitInterval: every,
		// Transactions of one small batch each, many a second.
		Partition: partition.Config{BatchMaxRecords: 10, CommitMaxBatches: 1},
	})
	began := time.Now()
	stop := run(t, e)
	b.verify(t, "coalesced")
	stop()
	took := time.Since(began)
	txns := counter(t, reg, "projector_batch_commit_duration_seconds")
	n := commits.Load()
	t.Logf("%v transactions in %v, %d commits to the group", txns, took.Round(time.Millisecond), n)
	if most := int64(took/every) + 2; n > most {
		t.Errorf("%d commits to the group in %v, want at most one per %v and one as the member left (%d)", n, took, every, most)
	}
	if txns < 10*float64(n) {
		t.Errorf("only %v transactions for %d group commits: the test did not commit often enough to show coalescing", txns, n)
	}
	at, err := b.groupOffsets(t.Context(), b.admin(t), "coalesced")
	if err != nil || !maps.Equal(at, b.end) {
		t.Errorf("group offsets %v (%v), want the stored ones %v", at, err, b.end)
	}
}
