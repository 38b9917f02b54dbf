package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// TestMain lets a test start this binary as a projector process (see
// startChild).
func TestMain(m *testing.M) { testenv.RunTests(m, "projector", Main) }

// child is a projector process started from this test binary.
type child struct {
	cmd    *exec.Cmd
	stderr *syncBuffer // written by the process while the test reads it
	done   chan error
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := testenv.ChildCommand(t, args...)
	c := &child{cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.done
	c.done <- nil // for the cleanup
}

// TestCrashRecovery kills a projector process with SIGKILL several times
// mid-stream and restarts it, under each group protocol (a KIP-848
// member killed holds its partitions until the brokers' session timeout
// expires it, as a classic one does until its own); the final table must
// equal the reference fold, with every parked event and poison pill
// stored exactly once.
func TestCrashRecovery(t *testing.T) {
	// Waits on processes and timeouts more than it computes: run beside
	// the other long tests of its kind.
	t.Parallel()
	for _, protocol := range []string{projector.GroupProtocolClassic, projector.GroupProtocolConsumer} {
		t.Run(protocol, func(t *testing.T) { crashRecovery(t, protocol) })
	}
}

func crashRecovery(t *testing.T, protocol string) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 3000, 7
	c := newCrashStream(t, 6, opts, demo.Projections, "100", protocol)
	db, records := c.db, c.records

	// Kill after every eighth of the stream has been committed since the
	// last start, so each kill lands mid-stream with batches in flight.
	c.crashAndFinish(t, 4)

	c.statusCaughtUp(t)
	c.groupOf(t, protocol)

	exp := demo.Fold(records)
	if err := demo.Verify(ctx, db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	var parked, dead, deadRows int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_parked), (SELECT count(DISTINCT (partition, "offset")) FROM projector_dead_letters), (SELECT count(*) FROM projector_dead_letters)`).Scan(&parked, &dead, &deadRows); err != nil {
		t.Fatal(err)
	}
	if parked != exp.Parked {
		t.Errorf("parked events: got %d, want %d", parked, exp.Parked)
	}
	if dead != exp.Poison || deadRows != exp.Poison {
		t.Errorf("dead letters: %d distinct offsets in %d rows; want %d poison pills, each once", dead, deadRows, exp.Poison)
	}
}

// crashAndFinish runs `projector run` with the stream's args as a child
// process, kills it with SIGKILL kills times, each after another kills-th
// of the records has been committed since the last start, then runs it
// once more until everything is committed and stops it with SIGTERM, which
// it must obey cleanly.
func (cs *crashStream) crashAndFinish(t *testing.T, kills int) {
	t.Helper()
	ctx := t.Context()
	db, args, identity, topic, end, total := cs.db, cs.args, crashIdentity, cs.topic, cs.end, int64(len(cs.records))
	var last int64
	for k := 0; k < kills; k++ {
		c := startChild(t, args...)
		target := last + total/int64(kills*2)
		testenv.WaitFor(t, time.Minute, func() error {
			select {
			case err := <-c.done:
				t.Fatalf("projector exited early: %v\n%s", err, c.stderr)
			default:
			}
			n, done, err := demo.Committed(ctx, db.Pool, identity, topic, end)
			if err != nil {
				return err
			}
			if n < target && !done {
				return fmt.Errorf("no progress to %d committed records (at %d); child stderr:\n%s", target, n, c.stderr)
			}
			last = n
			return nil
		})
		c.kill(t)
		t.Logf("kill %d at %d of %d records committed", k+1, last, total)
	}
	if last >= total {
		t.Fatalf("the stream was fully committed before the last kill; the test did not crash mid-stream")
	}

	c := startChild(t, args...)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, db.Pool, identity, topic, end, nil); err != nil {
		t.Fatalf("%v\nchild stderr:\n%s", err, c.stderr)
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-c.done; err != nil {
		t.Errorf("projector did not stop cleanly on SIGTERM: %v\n%s", err, c.stderr)
	}
	c.done <- nil
	// Without --session-timeout, a KIP-848 member is not told that one
	// does not apply; and the brokers offer the protocol it asked for.
	for _, w := range []string{"does not apply under the consumer group protocol", "group protocol consumer (KIP-848) not used"} {
		if strings.Contains(c.stderr.String(), w) {
			t.Errorf("projector warned %q:\n%s", w, c.stderr)
		}
	}
}

// statusCaughtUp fails t unless `projector status` lists each partition of
// the stream once, with its stored offset and log end at the stream's end
// and no lag.
func (cs *crashStream) statusCaughtUp(t *testing.T) {
	t.Helper()
	broker, dbURL, identity, end := cs.broker, cs.db.URL, crashIdentity, cs.end
	var out bytes.Buffer
	if err := Main(t.Context(), []string{"status", "--json", "--brokers", broker, "--database-url", dbURL, "--identity", identity}, &out, &out); err != nil {
		t.Fatalf("status: %v\n%s", err, &out)
	}
	var status []struct {
		Topic         string `json:"topic"`
		Partition     int32  `json:"partition"`
		NextOffset    int64  `json:"next_offset"`
		HighWatermark int64  `json:"high_watermark"`
		Lag           int64  `json:"lag"`
	}
	if err := json.Unmarshal(out.Bytes(), &status); err != nil {
		t.Fatalf("status --json: %v\n%s", err, &out)
	}
	if len(status) != len(end) {
		t.Errorf("status lists %d partitions, want %d: one per partition, whatever the projections of its topic", len(status), len(end))
	}
	for _, s := range status {
		if s.Topic != cs.topic || s.NextOffset != end[s.Partition] || s.HighWatermark != end[s.Partition] || s.Lag != 0 {
			t.Errorf("status of partition %d: %+v, want next offset and log end %d, lag 0", s.Partition, s, end[s.Partition])
		}
	}
}

// groupOf fails t unless the processes' group is a group of protocol: a
// KIP-848 group is described by ConsumerGroupDescribe, a classic one is
// not.
func (cs *crashStream) groupOf(t *testing.T, protocol string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(cs.broker, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeConsumerGroups(t.Context(), crashIdentity)
	if err != nil {
		t.Fatal(err)
	}
	err = described[crashIdentity].Err
	if kip848 := err == nil; kip848 != (protocol == projector.GroupProtocolConsumer) {
		t.Errorf("group %s described as a KIP-848 group: %v (error %v); the processes ran with --group-protocol %s", crashIdentity, kip848, err, protocol)
	}
}

// crashIdentity is the identity of a crash test's projector processes.
const crashIdentity = "crash"

// crashStream is what a crash test kills its child in: a fresh database,
// the demo's schemas registered, opts' records produced into a fresh
// cluster of its partitions, the projection file written (its topic the
// cluster's) and migrated, and the child's arguments.
type crashStream struct {
	db      *testenv.DB
	broker  string
	topic   string
	records []demo.Record
	end     map[int32]int64
	args    []string
}

func newCrashStream(t *testing.T, partitions int, opts demo.Options, file []byte, batchMaxRecords, protocol string) *crashStream {
	t.Helper()
	ctx := t.Context()
	c := &crashStream{db: testenv.NewDB(t), records: demo.Generate(opts)}
	// The group notices a killed KIP-848 member after 6s, as it does a
	// classic one given --session-timeout 6s, and hands partitions over on
	// heartbeats every 100ms rather than Kafka's 5s.
	cluster := testenv.NewCluster(t, demo.Topic, partitions, testenv.FakeOpts(kfake.BrokerConfigs(map[string]string{
		"group.consumer.heartbeat.interval.ms": "100",
		"group.consumer.session.timeout.ms":    "6000",
	})))
	c.broker, c.topic = cluster.Brokers(), cluster.Topic
	file = bytes.ReplaceAll(file, []byte("topic: "+demo.Topic), []byte("topic: "+c.topic))
	reg := testenv.NewRegistry(t)
	enc, err := demo.RegisterSchemasFor(ctx, reg.Client, c.topic)
	if err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := demo.Produce(ctx, prod, enc, c.records, nil); err != nil {
		t.Fatal(err)
	}
	if c.end, err = demo.EndOffsets(ctx, kadm.NewClient(prod), c.topic); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, file, 0o600); err != nil {
		t.Fatal(err)
	}
	c.args = []string{"run",
		"--brokers", c.broker,
		"--registry-url", reg.URL,
		"--database-url", c.db.URL,
		"--identity", crashIdentity,
		"--config", config,
		"--http-addr", "",
		"--batch-max-records", batchMaxRecords,
		"--log-level", "warn",
		"--group-protocol", protocol,
	}
	if protocol == projector.GroupProtocolClassic {
		c.args = append(c.args, "--session-timeout", "6s") // the group notices a killed member sooner
	}
	var out bytes.Buffer
	if err := Main(ctx, []string{"migrate", "--database-url", c.db.URL, "--config", config}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	return c
}
