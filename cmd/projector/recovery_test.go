package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// The recovery test's settings. A stall is bounded by them (see
// recoveryBound).
const (
	recoveryMembers    = 3
	recoveryPartitions = 6
	recoveryKills      = 3
	// recoveryRate is how many records a second the producer writes, in
	// one produce request every recoveryTick.
	recoveryRate = 2000
	recoveryTick = 20 * time.Millisecond
	// recoverySession is the group's session timeout: --session-timeout
	// under the classic protocol, the group's consumer.session.timeout.ms
	// under the consumer protocol.
	recoverySession = 6 * time.Second
	// recoveryConsumerHeartbeat is the heartbeat interval the brokers
	// give a consumer-protocol member: Kafka's as scripts/kafka
	// configures it (group.consumer.heartbeat.interval.ms=1000), and the
	// embedded broker's, set to the same.
	recoveryConsumerHeartbeat = time.Second
	// recoveryPoll is how often the monitor reads the stored offsets and
	// the log ends.
	recoveryPoll = 50 * time.Millisecond
	// recoveryTimeout bounds the wait for the group to recover from one
	// kill; the bound asserted afterwards is far tighter.
	recoveryTimeout = 3 * time.Minute
)

// RecoveryReportEnv names a file that TestRecoveryAfterKills appends one
// JSON line per kill to.
const RecoveryReportEnv = "PROJECTOR_RECOVERY_REPORT"

// RecoveryMatrixEnv, set to 1, runs every scenario of
// TestRecoveryAfterKills on the embedded broker too.
const RecoveryMatrixEnv = "PROJECTOR_RECOVERY_MATRIX"

// recoveryScenario is one group protocol and kind of membership.
type recoveryScenario struct {
	protocol string // projector.GroupProtocolClassic or GroupProtocolConsumer
	static   bool   // --instance-id per member
	// twice kills the restarted member again as soon as the group lists
	// it, before the group has settled, and restarts it once more: a
	// member that dies while it joins (dynamic membership only).
	twice bool
}

func (s recoveryScenario) membership() string {
	if s.static {
		return "static"
	}
	return "dynamic"
}

func (s recoveryScenario) name() string {
	n := s.protocol + "_" + s.membership()
	if s.twice {
		n += "_killed_joining"
	}
	return n
}

func (s recoveryScenario) String() string {
	n := s.protocol + "/" + s.membership()
	if s.twice {
		n += ", the restarted member killed again while it joins"
	}
	return n
}

// recoveryBound is the longest a partition with records waiting may go
// without a commit after a member is killed, derived from the settings:
//
//   - The killed member's partitions stop at its last commit, and nobody
//     takes them until the group gives up on it: one session timeout after
//     its last heartbeat, which is at most the session timeout after the
//     kill.
//   - The survivors hear of the rebalance at their next heartbeat (under
//     classic, franz-go's interval is a third of the session timeout, 2s
//     here; under consumer, the brokers' 1s) and rejoin. The classic
//     cooperative protocol needs two rounds of join and sync to move a
//     partition (revoke, then assign), each heard of at a heartbeat: two
//     intervals. A revoked worker finishes its open batch (a batch of 100
//     records takes milliseconds; RevokeTimeout, 10s, only bounds a
//     stuck one).
//   - The new owner claims the partition in Postgres, fetches from the
//     stored offset and commits its first batch: well under a second on
//     an idle machine.
//
// That is 6s + 2·2s + 1s = 11s under classic (6s + 2·1s + 1s = 9s under
// consumer); the bound adds a margin of 4s for a loaded machine (two cores
// running the race detector, the brokers, Postgres and three members)
// and the monitor's resolution: 15s under classic, 13s under consumer.
//
// A static member restarted at once under the classic protocol takes its
// partitions back without the group waiting for its session: Kafka
// replaces the member and answers its JoinGroup with the current
// assignment. What remains is the restart, the join, the claim and the
// first commit (about 1s), with the same 4s margin: 5s, below the session
// timeout, so that a member that waits for its own session fails. Under
// the consumer protocol the brokers refuse the restarted member
// (UNRELEASED_INSTANCE_ID) until the killed one's session expires, so it
// has the dynamic members' bound.
//
// When the restarted member is killed again while it joins (twice), the
// group may complete the rebalance with it and hand it partitions; the
// brokers then wait one more session timeout for it (under classic, Kafka
// starts that session when the join completes), so the bound has two.
//
// The report that led to this test saw 180s on the embedded broker.
func recoveryBound(s recoveryScenario) time.Duration {
	if s.static && s.protocol == projector.GroupProtocolClassic {
		return time.Second + 4*time.Second
	}
	heartbeat := min(3*time.Second, recoverySession/3) // franz-go's default under classic
	if s.protocol == projector.GroupProtocolConsumer {
		heartbeat = recoveryConsumerHeartbeat
	}
	sessions := time.Duration(1)
	if s.twice {
		sessions = 2
	}
	return sessions*recoverySession + 2*heartbeat + time.Second + 4*time.Second
}

// TestRecoveryAfterKills measures how long partitions stall when a member
// of three is killed with SIGKILL and restarted at once, three times (a
// different member each time), while a producer writes the demo stream
// into six partitions at a steady rate. A monitor reads the stored offsets
// and the log ends every 50ms and records, per partition, every interval
// during which records were waiting and the stored offset did not move.
// Per kill it reports the longest stall (and which partition) and the
// median of the partitions' longest stalls; each must stay below
// recoveryBound. At the end the table equals the reference fold of what
// was produced.
//
// The scenarios are the group protocols (classic, consumer) times the
// membership (dynamic, static), and for dynamic members a restarted
// member killed again while it joins. Each takes 5 to 40 seconds, so make
// test (on the embedded broker) runs classic/dynamic only, the default
// deployment, in about 20; all run on Apache Kafka
// (PROJECTOR_TEST_KAFKA_BROKERS) or with PROJECTOR_RECOVERY_MATRIX=1.
// With PROJECTOR_RECOVERY_REPORT naming a file, one JSON line per kill is
// appended to it.
func TestRecoveryAfterKills(t *testing.T) {
	all := testenv.RealKafka() != nil || os.Getenv(RecoveryMatrixEnv) == "1"
	for _, s := range []recoveryScenario{
		{protocol: projector.GroupProtocolClassic},
		{protocol: projector.GroupProtocolClassic, static: true},
		{protocol: projector.GroupProtocolConsumer},
		{protocol: projector.GroupProtocolConsumer, static: true},
		{protocol: projector.GroupProtocolClassic, twice: true},
		{protocol: projector.GroupProtocolConsumer, twice: true},
	} {
		t.Run(s.name(), func(t *testing.T) {
			if !all && s != (recoveryScenario{protocol: projector.GroupProtocolClassic}) {
				t.Skipf("runs on Apache Kafka or with %s=1; make test runs classic/dynamic", RecoveryMatrixEnv)
			}
			if s.twice && s.protocol == projector.GroupProtocolClassic && testenv.RealKafka() == nil {
				// See docs/kafka.md, "Recovery after a member is killed".
				t.Skip("the embedded broker never expires a classic member killed while its JoinGroup was parked (it starts no session for a member whose join response it could not deliver), so its partitions stay assigned to it: runs on Apache Kafka")
			}
			runRecovery(t, s)
		})
	}
}

// killReport is what one kill cost: the longest stall of any partition
// and the median of the partitions' longest stalls, between the kill and
// the recovery (every partition committed after the group settled).
type killReport struct {
	Broker     string `json:"broker"`
	Protocol   string `json:"protocol"`
	Membership string `json:"membership"`
	// KilledJoining: the restarted member was killed again while it
	// joined, and restarted once more.
	KilledJoining bool    `json:"killed_joining,omitempty"`
	Kill          int     `json:"kill"`
	Member        int     `json:"member"`
	MaxStall      float64 `json:"max_stall_s"`
	Partition     int32   `json:"partition"`
	Median        float64 `json:"median_stall_s"`
	Recovery      float64 `json:"recovery_s"` // from the kill to every partition committing after the group settled
}

func runRecovery(t *testing.T, s recoveryScenario) {
	ctx := t.Context()
	rs := newRecoveryStream(t, s)
	broker := "embedded"
	if rs.cluster.Real() {
		broker = "kafka"
	}

	members := make([]*child, recoveryMembers)
	for i := range members {
		members[i] = startChild(t, rs.memberArgs(i)...)
	}
	rs.produce(t)
	mon := rs.monitor(t)

	alive := func() error {
		for i, m := range members {
			select {
			case err := <-m.done:
				m.done <- err
				return fmt.Errorf("member %d exited: %v\n%s", i, err, m.stderr)
			default:
			}
		}
		return nil
	}
	// settle waits until the group has every member and every partition
	// assigned, with membership other than before (nil: any), and every
	// partition has committed since; it returns the members.
	settle := func(what string, before []string) []string {
		var ids []string
		var settledAt, lastLook time.Time
		lastErr := errors.New(what + ": group not described yet")
		testenv.WaitFor(t, recoveryTimeout, func() error {
			if err := alive(); err != nil {
				t.Fatal(err)
			}
			if err := mon.failed(); err != nil {
				t.Fatal(err)
			}
			if settledAt.IsZero() {
				if time.Since(lastLook) < 100*time.Millisecond {
					return lastErr
				}
				lastLook = time.Now()
				got, err := rs.settled(ctx)
				if err == nil && before != nil && slices.Equal(got, before) {
					err = errors.New("the group still lists the killed member")
				}
				if err != nil {
					lastErr = fmt.Errorf("%s: %w", what, err)
					return lastErr
				}
				ids, settledAt = got, time.Now()
			}
			if waiting := mon.notCommittedSince(settledAt); len(waiting) > 0 {
				return fmt.Errorf("%s: the group settled, partitions %v have not committed since", what, waiting)
			}
			return nil
		})
		return ids
	}

	ids := settle("start", nil)
	var reports []killReport
	for k := range recoveryKills {
		victim := k % recoveryMembers
		members[victim].kill(t)
		killedAt := time.Now()
		members[victim] = startChild(t, rs.memberArgs(victim)...)
		if s.twice {
			rs.waitJoined(t)
			members[victim].kill(t)
			members[victim] = startChild(t, rs.memberArgs(victim)...)
		}
		ids = settle(fmt.Sprintf("kill %d (member %d)", k+1, victim), ids)
		recoveredAt := time.Now()
		longest := mon.longestStalls(killedAt, recoveredAt)
		r := killReport{
			Broker: broker, Protocol: s.protocol, Membership: s.membership(), KilledJoining: s.twice, Kill: k + 1, Member: victim,
			Recovery: recoveredAt.Sub(killedAt).Seconds(),
		}
		var all []float64
		for _, p := range slices.Sorted(maps.Keys(longest)) {
			d := longest[p].Seconds()
			all = append(all, d)
			if d > r.MaxStall {
				r.MaxStall, r.Partition = d, p
			}
		}
		r.Median = median(all)
		reports = append(reports, r)
	}
	if rs.ranOut.Load() {
		t.Fatalf("the generated stream ran out before the last recovery: the stalls after it were not measured; generate more")
	}

	var table strings.Builder
	fmt.Fprintf(&table, "recovery after kill -9, %s broker, %s, %d members, %d partitions, %d records/s, session timeout %s, bound %s\n",
		broker, s, recoveryMembers, recoveryPartitions, recoveryRate, recoverySession, recoveryBound(s))
	fmt.Fprintf(&table, "%-5s %-7s %-10s %-10s %-9s %-10s\n", "kill", "member", "max stall", "partition", "median", "recovered")
	for _, r := range reports {
		fmt.Fprintf(&table, "%-5d %-7d %-10s %-10d %-9s %-10s\n", r.Kill, r.Member, secs(r.MaxStall), r.Partition, secs(r.Median), secs(r.Recovery))
	}
	fmt.Fprintf(&table, "monitor: longest gap between polls %s", mon.maxGap().Round(time.Millisecond))
	t.Log(table.String())
	appendRecoveryReport(t, reports)
	for _, r := range reports {
		if bound := recoveryBound(s); r.MaxStall > bound.Seconds() {
			t.Errorf("kill %d (member %d): partition %d stalled %s with records waiting, above the bound %s (session timeout %s, rebalance and first commit; see recoveryBound)",
				r.Kill, r.Member, r.Partition, secs(r.MaxStall), bound, recoverySession)
		}
	}

	// The table equals the reference fold of everything produced.
	produced := rs.stopProducing(t)
	mon.stop()
	end, err := demo.EndOffsets(ctx, rs.adm, rs.cluster.Topic)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, rs.db.Pool, rs.group, rs.cluster.Topic, end, nil); err != nil {
		t.Fatalf("%v\nmember 0:\n%s", err, members[0].stderr)
	}
	if err := demo.Verify(ctx, rs.db.Pool, demo.Table, demo.Fold(rs.records[:produced])); err != nil {
		t.Fatal(err)
	}
}

func secs(s float64) string { return strconv.FormatFloat(s, 'f', 2, 64) + "s" }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// appendRecoveryReport appends the reports as JSON lines to the file
// RecoveryReportEnv names, if it names one.
func appendRecoveryReport(t *testing.T, reports []killReport) {
	t.Helper()
	path := os.Getenv(RecoveryReportEnv)
	if path == "" {
		return
	}
	var b bytes.Buffer
	for _, r := range reports {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("%s: %v", RecoveryReportEnv, err)
	}
	defer f.Close()
	if _, err := f.Write(b.Bytes()); err != nil {
		t.Fatalf("%s: %v", RecoveryReportEnv, err)
	}
}

// recoveryStream is the world of one recovery scenario: a fresh database
// and cluster, the demo's schemas registered, the projection file
// migrated, a generated stream for the producer, and the group's name.
type recoveryStream struct {
	scenario recoveryScenario
	db       *testenv.DB
	cluster  *testenv.Cluster
	cl       *kgo.Client
	adm      *kadm.Client
	enc      *demo.Encoder
	group    string
	args     []string
	records  []demo.Record

	produced atomic.Int64 // records acknowledged
	ranOut   atomic.Bool
	stopProd func() int64
}

func newRecoveryStream(t *testing.T, s recoveryScenario) *recoveryStream {
	t.Helper()
	ctx := t.Context()
	rs := &recoveryStream{scenario: s, db: testenv.NewDB(t)}
	// The embedded broker hands consumer-protocol members the heartbeat
	// interval scripts/kafka gives Kafka's; it reads that from its broker
	// config only, not from the group's (see setGroupConfig).
	rs.cluster = testenv.NewCluster(t, demo.Topic, recoveryPartitions, testenv.FakeOpts(kfake.BrokerConfigs(map[string]string{
		"group.consumer.heartbeat.interval.ms": strconv.Itoa(int(recoveryConsumerHeartbeat.Milliseconds())),
	})))
	rs.group = rs.cluster.Name("recovery")
	var err error
	rs.cl, err = kgo.NewClient(kgo.SeedBrokers(rs.cluster.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.cl.Close)
	rs.adm = kadm.NewClient(rs.cl)
	if s.protocol == projector.GroupProtocolConsumer {
		rs.setGroupConfig(t)
	}

	// Enough records for four minutes at the rate: the scenario takes
	// about one.
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 4*60*recoveryRate/11, 11
	rs.records = demo.Generate(opts)

	reg := testenv.NewRegistry(t)
	if rs.enc, err = demo.RegisterSchemasFor(ctx, reg.Client, rs.cluster.Topic); err != nil {
		t.Fatal(err)
	}
	file := bytes.ReplaceAll(demo.Projections, []byte("topic: "+demo.Topic), []byte("topic: "+rs.cluster.Topic))
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, file, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Main(ctx, []string{"migrate", "--database-url", rs.db.URL, "--config", config}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	rs.args = []string{"run",
		"--brokers", rs.cluster.Brokers(),
		"--registry-url", reg.URL,
		"--database-url", rs.db.URL,
		"--identity", rs.group,
		"--config", config,
		"--http-addr", "",
		"--batch-max-records", "100",
		"--log-level", "warn",
		"--group-protocol", s.protocol,
	}
	if s.protocol == projector.GroupProtocolClassic {
		// Under consumer the group's consumer.session.timeout.ms applies
		// instead (setGroupConfig), and a member given one warns.
		rs.args = append(rs.args, "--session-timeout", recoverySession.String())
	}
	return rs
}

// setGroupConfig gives the consumer-protocol group the session timeout
// the classic members are given (--session-timeout), and the heartbeat
// interval scripts/kafka configures Kafka's brokers with: Kafka's default
// session timeout there is 10s, the embedded broker's 45s, and measuring
// either against the classic protocol's 6s would compare settings rather
// than behaviour. It is how a user sets them per group
// (kafka-configs --entity-type groups).
func (rs *recoveryStream) setGroupConfig(t *testing.T) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = rs.group
	for name, v := range map[string]time.Duration{
		"consumer.session.timeout.ms":    recoverySession,
		"consumer.heartbeat.interval.ms": recoveryConsumerHeartbeat,
	} {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = name, kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(strconv.Itoa(int(v.Milliseconds())))
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(t.Context(), rs.cl)
	if err != nil {
		t.Fatalf("set the group's configs: %v", err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("set the group's configs: %v (%s)", err, pointerOr(r.ErrorMessage, ""))
		}
	}
}

func pointerOr(s *string, or string) string {
	if s == nil {
		return or
	}
	return *s
}

// memberArgs are the arguments of member i.
func (rs *recoveryStream) memberArgs(i int) []string {
	args := slices.Clone(rs.args)
	if rs.scenario.static {
		args = append(args, "--instance-id", "member-"+strconv.Itoa(i))
	}
	return args
}

// produce writes the stream at recoveryRate until stopProducing, in
// order, each chunk acknowledged before the next.
func (rs *recoveryStream) produce(t *testing.T) {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan error, 1)
	chunk := int(recoveryRate * recoveryTick / time.Second)
	go func() {
		tick := time.NewTicker(recoveryTick)
		defer tick.Stop()
		for next := 0; ; {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
			if next >= len(rs.records) {
				rs.ranOut.Store(true)
				continue
			}
			end := min(next+chunk, len(rs.records))
			// Not under the test's context: a chunk is either
			// acknowledged whole or fails the test.
			if err := demo.Produce(context.Background(), rs.cl, rs.enc, rs.records[next:end], nil); err != nil {
				done <- err
				return
			}
			next = end
			rs.produced.Store(int64(next))
		}
	}()
	var once sync.Once
	rs.stopProd = func() int64 {
		once.Do(func() {
			close(stop)
			if err := <-done; err != nil {
				t.Errorf("producer: %v", err)
			}
		})
		return rs.produced.Load()
	}
	t.Cleanup(func() { rs.stopProd() })
}

// stopProducing stops the producer and returns how many records of the
// stream it wrote.
func (rs *recoveryStream) stopProducing(t *testing.T) int64 {
	t.Helper()
	return rs.stopProd()
}

// settled describes the group and returns its members' ids, sorted, when
// it is stable with recoveryMembers members, each with partitions (its
// target under the consumer protocol), and every partition assigned.
func (rs *recoveryStream) settled(ctx context.Context) ([]string, error) {
	var ids []string
	assigned := map[int32]int{}
	if rs.scenario.protocol == projector.GroupProtocolConsumer {
		gs, err := rs.adm.DescribeConsumerGroups(ctx, rs.group)
		if err != nil {
			return nil, err
		}
		g := gs[rs.group]
		if g.Err != nil {
			return nil, g.Err
		}
		if g.State != "Stable" {
			return nil, fmt.Errorf("group %s, want Stable", g.State)
		}
		for _, m := range g.Members {
			ids = append(ids, m.MemberID)
			var mine []int32
			m.Assignment.Each(func(topic string, p int32) {
				// The only topic; a broker may leave its name out.
				if topic == rs.cluster.Topic || topic == "" {
					mine = append(mine, p)
					assigned[p]++
				}
			})
			if len(mine) == 0 || !maps.EqualFunc(m.Assignment, m.TargetAssignment, func(a, b map[int32]struct{}) bool { return maps.Equal(a, b) }) {
				return nil, fmt.Errorf("member %s has %v, target %v", m.MemberID, m.Assignment.Sorted(), m.TargetAssignment.Sorted())
			}
		}
	} else {
		gs, err := rs.adm.DescribeGroups(ctx, rs.group)
		if err != nil {
			return nil, err
		}
		g := gs[rs.group]
		if g.Err != nil {
			return nil, g.Err
		}
		if g.State != "Stable" {
			return nil, fmt.Errorf("group %s, want Stable", g.State)
		}
		for _, m := range g.Members {
			ids = append(ids, m.MemberID)
			c, ok := m.Assigned.AsConsumer()
			n := 0
			if ok {
				for _, tp := range c.Topics {
					if tp.Topic != rs.cluster.Topic {
						continue
					}
					for _, p := range tp.Partitions {
						assigned[p]++
						n++
					}
				}
			}
			if n == 0 {
				return nil, fmt.Errorf("member %s has no partitions", m.MemberID)
			}
		}
	}
	if len(ids) != recoveryMembers {
		return nil, fmt.Errorf("group lists %d members, want %d", len(ids), recoveryMembers)
	}
	for p := range int32(recoveryPartitions) {
		if assigned[p] != 1 {
			return nil, fmt.Errorf("partition %d is assigned %d times", p, assigned[p])
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// waitJoined waits until the group lists more than recoveryMembers
// members: the restarted one has joined while the killed one is still
// there, and the rebalance that joining starts has not completed.
func (rs *recoveryStream) waitJoined(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	testenv.WaitFor(t, time.Minute, func() error {
		var state string
		var n int
		if rs.scenario.protocol == projector.GroupProtocolConsumer {
			gs, err := rs.adm.DescribeConsumerGroups(ctx, rs.group)
			if err != nil {
				return err
			}
			state, n = gs[rs.group].State, len(gs[rs.group].Members)
		} else {
			gs, err := rs.adm.DescribeGroups(ctx, rs.group)
			if err != nil {
				return err
			}
			state, n = gs[rs.group].State, len(gs[rs.group].Members)
			if state != "PreparingRebalance" {
				n = 0
			}
		}
		if n <= recoveryMembers {
			return fmt.Errorf("the restarted member has not joined: group %s with %d members", state, n)
		}
		return nil
	})
}

// stallMonitor polls the stored offsets and the log ends and keeps, per
// partition, the intervals during which records were waiting and the
// stored offset did not move.
type stallMonitor struct {
	rs     *recoveryStream
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	parts  map[int32]*partitionWatch
	stalls []stallInterval // closed ones
	last   time.Time       // of the last successful poll
	gap    time.Duration   // longest between two successful polls
	err    error           // the poll failing for longer than a second
}

type partitionWatch struct {
	stored, end int64
	known       bool
	// since is when the partition last committed, or when records began
	// waiting after it had none waiting: a stall is [since, now] while
	// records wait.
	since time.Time
	// moved is when the stored offset was last seen to change.
	moved time.Time
}

type stallInterval struct {
	partition  int32
	start, end time.Time
}

func (rs *recoveryStream) monitor(t *testing.T) *stallMonitor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := &stallMonitor{rs: rs, cancel: cancel, done: make(chan struct{}), parts: map[int32]*partitionWatch{}}
	for p := range int32(recoveryPartitions) {
		m.parts[p] = &partitionWatch{}
	}
	go m.run(ctx)
	t.Cleanup(m.stop)
	return m
}

func (m *stallMonitor) stop() {
	m.cancel()
	<-m.done
}

func (m *stallMonitor) run(ctx context.Context) {
	defer close(m.done)
	tick := time.NewTicker(recoveryPoll)
	defer tick.Stop()
	var failingSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := m.poll(ctx)
		m.mu.Lock()
		switch {
		case err == nil:
			failingSince = time.Time{}
		case ctx.Err() != nil:
		case failingSince.IsZero():
			failingSince = time.Now()
		case time.Since(failingSince) > time.Second:
			m.err = fmt.Errorf("the monitor could not read offsets for %s: %w", time.Since(failingSince).Round(time.Millisecond), err)
		}
		m.mu.Unlock()
	}
}

// poll reads the log ends, then the stored offsets (so that a stored
// offset is never compared with an older log end), and updates the
// partitions' stalls.
func (m *stallMonitor) poll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ends, err := demo.EndOffsets(ctx, m.rs.adm, m.rs.cluster.Topic)
	if err != nil {
		return err
	}
	rows, err := m.rs.db.Pool.Query(ctx, `SELECT partition, next_offset FROM projector_offsets WHERE identity = $1 AND topic = $2 AND next_offset IS NOT NULL`, m.rs.group, m.rs.cluster.Topic)
	if err != nil {
		return err
	}
	stored := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return err
		}
		stored[p] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.last.IsZero() {
		m.gap = max(m.gap, now.Sub(m.last))
	}
	m.last = now
	for p, w := range m.parts {
		s, ok := stored[p]
		if !ok {
			continue // not claimed yet
		}
		waitedBefore := w.known && w.end > w.stored
		moved := !w.known || s != w.stored
		if moved && waitedBefore && w.known {
			m.stalls = append(m.stalls, stallInterval{partition: p, start: w.since, end: now})
		}
		waiting := ends[p] > s
		switch {
		case moved:
			w.since, w.moved = now, now
		case !waiting || !waitedBefore:
			// Nothing waiting, or records began waiting just now:
			// no stall before this poll.
			w.since = now
		}
		w.stored, w.end, w.known = s, ends[p], true
	}
	return nil
}

func (m *stallMonitor) failed() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *stallMonitor) maxGap() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gap
}

// notCommittedSince returns the partitions with records waiting that have
// not committed since t.
func (m *stallMonitor) notCommittedSince(t time.Time) []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int32
	for p, w := range m.parts {
		if !w.known || (w.end > w.stored && !w.moved.After(t)) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// longestStalls returns, per partition, the longest stall that overlaps
// [from, to], counting a stall still open as lasting until to.
func (m *stallMonitor) longestStalls(from, to time.Time) map[int32]time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[int32]time.Duration{}
	for p := range m.parts {
		out[p] = 0
	}
	consider := func(s stallInterval) {
		if s.end.After(from) && s.start.Before(to) {
			out[s.partition] = max(out[s.partition], s.end.Sub(s.start))
		}
	}
	for _, s := range m.stalls {
		consider(s)
	}
	for p, w := range m.parts {
		if w.known && w.end > w.stored {
			consider(stallInterval{partition: p, start: w.since, end: to})
		}
	}
	return out
}
