package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// offsetsEnv is a migrated database, a Kafka cluster with the demo topic
// and a registry with the demo schemas, for one identity.
type offsetsEnv struct {
	t        *testing.T
	db       *testenv.DB
	kafka    *testenv.Cluster
	reg      *sr.Client
	enc      *demo.Encoder
	projs    []*projection.Projection
	identity string
	records  []demo.Record // everything produced, for the reference fold
}

func newOffsetsEnv(t *testing.T, partitions int) *offsetsEnv {
	t.Helper()
	e := &offsetsEnv{t: t, db: testenv.NewDB(t), kafka: testenv.NewCluster(t, demo.Topic, partitions), identity: "resets"}
	e.reg = testenv.NewRegistry(t).Client
	var err error
	if e.enc, err = demo.RegisterSchemasFor(t.Context(), e.reg, e.kafka.Topic); err != nil {
		t.Fatal(err)
	}
	if e.projs, err = projection.Parse(demo.Projections, "."); err != nil {
		t.Fatal(err)
	}
	for _, p := range e.projs {
		p.Topic = e.kafka.Topic
	}
	if err := postgres.Migrate(t.Context(), e.db.Pool, e.projs...); err != nil {
		t.Fatal(err)
	}
	return e
}

// produce writes AccountOpened events for prefix-from … prefix-(to-1) to
// one partition, the i-th stamped at ts(i) (nil: now).
func (e *offsetsEnv) produce(p int32, prefix string, from, to int, ts func(i int) time.Time) {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	for i := from; i < to; i++ {
		id := prefix + strconv.Itoa(i)
		r := demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "o"}}
		value, err := e.enc.Encode(r)
		if err != nil {
			e.t.Fatal(err)
		}
		rec := &kgo.Record{Topic: e.kafka.Topic, Partition: p, Key: []byte(id), Value: value}
		if ts != nil {
			rec.Timestamp = ts(i)
		}
		if err := cl.ProduceSync(e.t.Context(), rec).FirstErr(); err != nil {
			e.t.Fatal(err)
		}
		e.records = append(e.records, r)
	}
}

// engine starts a member of the identity; stop ends it.
func (e *offsetsEnv) engine(reg prometheus.Registerer) (eng *projector.Engine, stop func()) {
	e.t.Helper()
	reader := e.enc.ReaderSchema()
	eng, err := projector.New(projector.Config{
		Brokers:     e.kafka.Addrs(),
		Identity:    e.identity,
		Projections: e.projs,
		Registerer:  reg,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Store:       postgres.NewStore(e.db.Pool),
	}, func(*projection.Projection) partition.Decoder { return schemas.NewDecoder(e.reg, reader) })
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.t.Context())
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("engine: %v", err)
		}
	}
	e.t.Cleanup(stop)
	return eng, stop
}

// stored returns the stored next offset and owner epoch of a partition.
func (e *offsetsEnv) stored(p int32) (next *int64, epoch int64) {
	e.t.Helper()
	if err := e.db.Pool.QueryRow(e.t.Context(), `SELECT next_offset, owner_epoch FROM projector_offsets
		WHERE identity = $1 AND topic = $2 AND partition = $3`, e.identity, e.kafka.Topic, p).Scan(&next, &epoch); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.t.Fatal(err)
	}
	return next, epoch
}

func (e *offsetsEnv) waitStored(p int32, want int64) {
	e.t.Helper()
	testenv.WaitFor(e.t, 30*time.Second, func() error {
		if next, _ := e.stored(p); next == nil || *next != want {
			return fmt.Errorf("partition %d: stored offset %v, want %d", p, orDash(next), want)
		}
		return nil
	})
}

// cli runs projector with args and the environment's brokers, database and
// identity.
func (e *offsetsEnv) cli(args ...string) (string, error) {
	e.t.Helper()
	var out bytes.Buffer
	if args[0] != "offsets" || args[1] != "audit" {
		args = append(args, "--brokers", e.kafka.Brokers())
	}
	args = append(args, "--database-url", e.db.URL, "--identity", e.identity)
	err := Main(e.t.Context(), args, &out, &out)
	return out.String(), err
}

func (e *offsetsEnv) mustCLI(args ...string) string {
	e.t.Helper()
	out, err := e.cli(args...)
	if err != nil {
		e.t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *offsetsEnv) status() map[int32]partitionStatus {
	e.t.Helper()
	out := e.mustCLI("status", "--json")
	var rows []partitionStatus
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		e.t.Fatalf("status --json: %v\n%s", err, out)
	}
	m := map[int32]partitionStatus{}
	for _, r := range rows {
		m[r.Partition] = r
	}
	return m
}

func (e *offsetsEnv) resets() int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(e.t.Context(), `SELECT count(*) FROM projector_offsets_audit`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestOffsetsReset deletes and creates the topic again under an identity,
// so that a stored offset lies past the new log's end: status says so
// instead of showing no lag, `offsets reset` prints its plan without
// changing anything, then with --execute moves the offsets in one
// audited step that fences the live owner, which then resumes from the
// new offsets: the table equals the fold of everything produced but the
// records the reset skipped.
func TestOffsetsReset(t *testing.T) {
	e := newOffsetsEnv(t, 2)
	e.produce(0, "old-", 0, 10, nil)
	e.produce(1, "one-", 0, 10, nil)
	_, stop := e.engine(nil)
	e.waitStored(0, 10)
	e.waitStored(1, 10)
	stop()

	e.kafka.DeleteTopic(e.kafka.Topic)
	e.kafka.CreateTopic(e.kafka.Topic, 2, nil)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	minutes := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	e.produce(0, "new-", 0, 3, nil)
	e.produce(1, "two-", 0, 12, minutes)

	reg := prometheus.NewRegistry()
	live, stopLive := e.engine(reg)
	testenv.WaitFor(t, 30*time.Second, func() error {
		for _, s := range live.Workers() {
			if s.Partition == 0 && s.Halted != "" {
				return nil
			}
		}
		return fmt.Errorf("partition 0 not halted: %+v", live.Workers())
	})
	e.waitStored(1, 12)

	st := e.status()
	// Once the member has recorded its halt (within its state interval)
	// the state is the halt, of the same kind.
	beyond := func(r partitionStatus) bool {
		return r.State == stateBeyondLogEnd || r.State == sinks.PartitionHalted && r.Halt == sinks.HaltBeyondLogEnd
	}
	if p0 := st[0]; !beyond(p0) || p0.Lag != nil || orDash(p0.HighWatermark) != "3" {
		t.Errorf("status of partition 0 (stored 10, log end 3): state %q, lag %s, log end %s; want %q, no lag, 3",
			p0.State, orDash(p0.Lag), orDash(p0.HighWatermark), stateBeyondLogEnd)
	}
	if p1 := st[1]; p1.State != stateOK || orDash(p1.Lag) != "0" {
		t.Errorf("status of partition 1: state %q, lag %s; want ok, 0", p1.State, orDash(p1.Lag))
	}
	if table := e.mustCLI("status"); !strings.Contains(table, stateBeyondLogEnd) || !strings.Contains(table, "LOG-END-OFFSET") {
		t.Errorf("status table does not show the state:\n%s", table)
	}

	// A dry run prints the plan and changes nothing.
	_, epoch0 := e.stored(0)
	plan := e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--partitions", "0", "--to-earliest")
	if !strings.Contains(plan, "dry run") || !strings.Contains(plan, "CURRENT-OFFSET  NEW-OFFSET") {
		t.Errorf("dry run output:\n%s", plan)
	}
	var planned []resetPlan
	if err := json.Unmarshal([]byte(e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--to-datetime", minutes(3).Format(time.RFC3339Nano), "--json")), &planned); err != nil {
		t.Fatal(err)
	}
	if len(planned) != 2 || planned[0].NewOffset != 0 || orDash(planned[0].CurrentOffset) != "10" || planned[1].NewOffset != 3 || orDash(planned[1].CurrentOffset) != "12" {
		t.Errorf("plan for --to-datetime at the 4th record of partition 1: %+v; want partition 0 10→0, partition 1 12→3", planned)
	}
	if next, epoch := e.stored(0); orDash(next) != "10" || epoch != epoch0 || e.resets() != 0 {
		t.Fatalf("a dry run changed partition 0 to %s at epoch %d (was 10 at %d), or audited it", orDash(next), epoch, epoch0)
	}

	out := e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--to-datetime", minutes(3).Format(time.RFC3339Nano), "--execute", "--actor", "alice")
	if !strings.Contains(out, "moved 2 stored offsets") {
		t.Errorf("reset --execute output:\n%s", out)
	}
	if next, epoch := e.stored(0); orDash(next) != "0" || epoch != epoch0+1 {
		t.Errorf("partition 0 after the reset: offset %s at epoch %d, want 0 at %d", orDash(next), epoch, epoch0+1)
	}
	var audit []struct {
		Actor     string `json:"actor"`
		OSUser    string `json:"os_user"`
		DBUser    string `json:"db_user"`
		Partition int32  `json:"partition"`
		OldOffset *int64 `json:"old_offset"`
		NewOffset int64  `json:"new_offset"`
		Target    string `json:"target"`
	}
	if err := json.Unmarshal([]byte(e.mustCLI("offsets", "audit", "--json")), &audit); err != nil {
		t.Fatal(err)
	}
	if len(audit) != 2 {
		t.Fatalf("audit: %+v, want a row per partition", audit)
	}
	for _, a := range audit {
		want := map[int32]string{0: "10→0", 1: "12→3"}[a.Partition]
		if got := orDash(a.OldOffset) + "→" + strconv.FormatInt(a.NewOffset, 10); a.Actor != "alice" || got != want || !strings.HasPrefix(a.Target, "--to-datetime") {
			t.Errorf("audit row %+v: want alice moving partition %d %s by --to-datetime", a, a.Partition, want)
		}
		if me, err := user.Current(); err != nil || a.OSUser != me.Username || a.DBUser != "postgres" {
			t.Errorf("audit row %+v: want the operating-system user and the database user postgres beside alice (%v)", a, err)
		}
	}

	// The live owner of partition 1 is fenced at its next commit, so it
	// cannot write its own position over the reset one; it then takes the
	// partition up again from the reset offset, as it does the halted
	// partition 0.
	e.produce(1, "two-", 12, 14, nil)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := metricSum(t, reg, "projector_fenced_batches_total"); n == 0 {
			return fmt.Errorf("the live owner committed no fenced batch yet")
		}
		return nil
	})
	e.waitStored(0, 3)
	e.waitStored(1, 14)
	testenv.WaitFor(t, 30*time.Second, func() error {
		for _, s := range live.Workers() {
			if s.Halted != "" {
				return fmt.Errorf("partition %d still halted: %s", s.Partition, s.Halted)
			}
		}
		return nil
	})
	if _, epoch := e.stored(0); epoch != epoch0+2 {
		t.Errorf("partition 0 at epoch %d, want %d: the reset's and the live owner's claim after it", epoch, epoch0+2)
	}
	stopLive()

	// The reset skipped the records of partition 1 before the chosen time.
	var read []demo.Record
	for _, r := range e.records {
		if r.Key != "two-0" && r.Key != "two-1" && r.Key != "two-2" {
			read = append(read, r)
		}
	}
	if err := demo.Verify(t.Context(), e.db.Pool, demo.Table, demo.Fold(read)); err != nil {
		t.Error(err)
	}
	if st := e.status(); st[0].State != stateOK || st[1].State != stateOK {
		t.Errorf("status after the reset: %+v", st)
	}
}

// TestOffsetsResetRefusesBadTargets checks the flags that need the
// topic's partitions, and that a plan for an identity with nothing stored
// says so.
func TestOffsetsResetRefusesBadTargets(t *testing.T) {
	e := newOffsetsEnv(t, 2)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--topic", e.kafka.Topic, "--partitions", "0,7", "--to-earliest"}, "--partitions: topic \"" + e.kafka.Topic + "\" has no partition 7"},
		{[]string{"--topic", "no.such.topic", "--to-latest"}, "--topic \"no.such.topic\": no such topic"},
	} {
		out, err := e.cli(append([]string{"offsets", "reset"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("offsets reset %s: %v\n%s\nwant an error naming %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	if e.resets() != 0 {
		t.Error("a refused reset was audited")
	}
	// An identity with no stored offsets (a mistyped --identity) is named.
	if out := e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--to-earliest"); !strings.Contains(out, `identity "resets" has no stored offsets`) {
		t.Errorf("dry run for an identity without stored offsets does not say so:\n%s", out)
	}
}

// metricSum sums the samples of a counter or gauge family.
func metricSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestOffsetsResetMovesAnEmptyGroup resets the stored offsets of an
// identity whose members have all left: the Kafka consumer group, which
// the members left at the stored offsets, is moved to the new ones too,
// so that Kafka's tools see the lag before a member runs. A member then
// resumes from the stored offsets and commits them to the group again.
func TestOffsetsResetMovesAnEmptyGroup(t *testing.T) {
	e := newOffsetsEnv(t, 2)
	e.identity = e.kafka.Name("emptygroup")
	e.produce(0, "a-", 0, 10, nil)
	e.produce(1, "b-", 0, 10, nil)
	_, stop := e.engine(nil)
	e.waitStored(0, 10)
	e.waitStored(1, 10)
	stop()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	group := func() map[int32]int64 {
		t.Helper()
		res, err := adm.FetchOffsets(t.Context(), e.identity)
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
		out := map[int32]int64{}
		for p, o := range res[e.kafka.Topic] {
			out[p] = o.At
		}
		return out
	}
	if got := group(); !maps.Equal(got, map[int32]int64{0: 10, 1: 10}) {
		t.Fatalf("group offsets after the member left: %v, want the stored 10 and 10", got)
	}

	out := e.mustCLI("offsets", "reset", "--topic", e.kafka.Topic, "--to-offset", "4", "--execute", "--actor", "alice")
	if !strings.Contains(out, "moved the offsets of the empty Kafka consumer group") {
		t.Errorf("reset --execute of an empty group's identity does not say it moved the group:\n%s", out)
	}
	if got := group(); !maps.Equal(got, map[int32]int64{0: 4, 1: 4}) {
		t.Errorf("group offsets after the reset: %v, want 4 and 4 as stored", got)
	}
	if next, _ := e.stored(0); orDash(next) != "4" {
		t.Errorf("stored offset of partition 0 after the reset: %s, want 4", orDash(next))
	}

	_, stop = e.engine(nil)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if got := group(); !maps.Equal(got, map[int32]int64{0: 10, 1: 10}) {
			return fmt.Errorf("group offsets %v after a member ran again, want 10 and 10", got)
		}
		return nil
	})
	stop()
}
