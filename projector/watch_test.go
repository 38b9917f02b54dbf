package projector_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/memsink"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
)

// watched builds an engine of the demo projection on brokers, logging into
// a buffer, with its watch shortened so that a member out of its group
// speaks after 300ms.
func watched(t *testing.T, b *bundle, brokers []string, cfg projector.Config) (*projector.Engine, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	cfg.Brokers, cfg.Identity, cfg.Projections = brokers, "watched", b.projs
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	if cfg.Store == nil {
		cfg.Store = memsink.New(nil)
	}
	reader := b.enc.ReaderSchema()
	e, err := projector.New(cfg, func(*projection.Projection) partition.Decoder { return schemas.NewDecoder(b.reg, reader) })
	if err != nil {
		t.Fatal(err)
	}
	projector.SetWatch(e, 50*time.Millisecond, 300*time.Millisecond)
	return e, logs
}

// closedPort is an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// count is how many log lines contain s.
func count(logs *lockedBuffer, s string) int { return strings.Count(logs.String(), s) }

// A member whose brokers do not answer says so within a second, once
// (not on every retry of its client), and /readyz names the brokers; so
// does the Kafka client, once per broker.
func TestUnreachableBrokersAreHeard(t *testing.T) {
	b := faultSetup(t, demo.DefaultOptions(), 1).bundle
	addr := closedPort(t)
	e, logs := watched(t, b, []string{addr}, projector.Config{})
	run(t, e)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("a warning that no broker answers", func() bool {
		return count(logs, "no Kafka broker answers") > 0
	}))
	if err := e.Ready(t.Context())["kafka"]; err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("/readyz kafka check: %v, want the unreachable seed broker named", err)
	}
	// The watch looks 20 times a second; it has looked at least 20 more
	// times once a second more has passed in which the client retried.
	deadline := time.Now().Add(time.Second)
	testenv.WaitFor(t, 5*time.Second, testenv.Holds("a second of retries", func() bool { return time.Now().After(deadline) }))
	if n := count(logs, "no Kafka broker answers"); n != 1 {
		t.Errorf("%d warnings that no broker answers in a second of retries, want 1:\n%s", n, logs)
	}
	if n := count(logs, "level=WARN msg=\"unable to open connection to broker\""); n != 1 {
		t.Errorf("%d client warnings about the broker, want 1 (the client's own, rate-limited):\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "\n"); n > 10 {
		t.Errorf("%d log lines in a second of an unreachable broker:\n%s", n, logs)
	}
}

// A projection whose topic does not exist is named in a warning and in
// /readyz; once the topic is created the member consumes it and says the
// problem is over.
func TestMissingTopicIsHeard(t *testing.T) {
	b := faultSetup(t, demo.DefaultOptions(), 1).bundle
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	e, logs := watched(t, b, cluster.ListenAddrs(), projector.Config{})
	run(t, e)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("a warning naming the missing topic", func() bool {
		return count(logs, "topic "+demo.Topic+" does not exist") > 0
	}))
	if err := e.Ready(t.Context())["kafka"]; err == nil || !strings.Contains(err.Error(), demo.Topic) {
		t.Errorf("/readyz kafka check: %v, want the missing topic named", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(t.Context(), 1, 1, nil, demo.Topic); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		if err := e.Ready(context.Background())["kafka"]; err != nil {
			return err
		}
		if count(logs, "Kafka problem over") != 1 {
			return fmt.Errorf("no line saying the problem is over")
		}
		return nil
	})
	if n := count(logs, "does not exist"); n != 1 {
		t.Errorf("%d warnings about the missing topic within a minute, want 1:\n%s", n, logs)
	}
}

// A member the brokers answer but whose group never lets it in (here:
// every JoinGroup, or under the consumer protocol every
// ConsumerGroupHeartbeat, fails) says it is not joined, naming the group.
// A KIP-848 member has a member id and epoch 0 before the coordinator
// ever answers it: that is not joined either.
func TestGroupNotJoinedIsHeard(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) {
			b := faultSetup(t, demo.DefaultOptions(), 1).bundle
			fake := b.kafka.Embedded("fails every request to join the group")
			key := kmsg.JoinGroup
			if protocol == projector.GroupProtocolConsumer {
				key = kmsg.ConsumerGroupHeartbeat
			}
			fake.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
				fake.KeepControl()
				if hb, ok := req.(*kmsg.ConsumerGroupHeartbeatRequest); ok && hb.MemberEpoch < 0 {
					// The member leaving as it stops: refused, its
					// client would retry for 30s before it closes.
					return nil, nil, false
				}
				resp := req.ResponseKind()
				// COORDINATOR_NOT_AVAILABLE: the client retries for ever.
				switch resp := resp.(type) {
				case *kmsg.JoinGroupResponse:
					resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
				case *kmsg.ConsumerGroupHeartbeatResponse:
					resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
				}
				return resp, nil, true
			})
			e, logs := watched(t, b, b.kafka.Addrs(), projector.Config{GroupProtocol: protocol})
			run(t, e)
			testenv.WaitFor(t, 10*time.Second, testenv.Holds("a warning that the member is not in its group", func() bool {
				return count(logs, `not joined to consumer group \"watched\"`) > 0
			}))
			if err := e.Ready(t.Context())["kafka"]; err == nil || !strings.Contains(err.Error(), "not joined") {
				t.Errorf("/readyz kafka check: %v, want not joined", err)
			}
			if err := e.Ready(t.Context())["group"]; err == nil {
				t.Errorf("/readyz group check passes, want not joined")
			}
		})
	}
}

// Every ProgressEvery, each projection whose partitions moved logs one
// line of what they did; the lines add up to the engine's counters and to
// the stream's dead letters, and nothing is logged while nothing moves.
func TestProgressIsLogged(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	b := setup(t, opts, 3)
	reg := prometheus.NewRegistry()
	e, logs := watched(t, b, b.kafka.Addrs(), projector.Config{ProgressEvery: 100 * time.Millisecond, Registerer: reg})
	run(t, e)
	exp := demo.Fold(b.records)
	line := regexp.MustCompile(`msg=progress group=watched projection=accounts applied=(\d+) stale=(\d+) dead_lettered=(\d+) parked=(\d+) lag=(\d+) partitions=(\d+)`)
	sums := func() (applied, stale, dead, lines int, last []string) {
		for _, m := range line.FindAllStringSubmatch(logs.String(), -1) {
			a, _ := strconv.Atoi(m[1])
			s, _ := strconv.Atoi(m[2])
			d, _ := strconv.Atoi(m[3])
			applied, stale, dead, lines, last = applied+a, stale+s, dead+d, lines+1, m
		}
		return
	}
	counter := func(outcome string) int {
		return int(counterOf(t, reg, "projector_records_processed_total", outcome))
	}
	testenv.WaitFor(t, 2*time.Minute, func() error {
		applied, stale, dead, _, last := sums()
		if dead != exp.Poison || last == nil || last[5] != "0" || applied != counter("applied") || stale != counter("stale") || applied == 0 {
			return fmt.Errorf("progress lines add up to %d applied, %d stale, %d dead-lettered (last %v); want %d, %d, %d and lag 0",
				applied, stale, dead, last, counter("applied"), counter("stale"), exp.Poison)
		}
		return nil
	})
	_, _, _, lines, _ := sums()
	deadline := time.Now().Add(500 * time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, testenv.Holds("half a second of nothing to do", func() bool { return time.Now().After(deadline) }))
	if _, _, _, after, _ := sums(); after != lines {
		t.Errorf("%d progress lines while nothing moved, want none:\n%s", after-lines, logs)
	}
}

// counterOf is the demo projection's counter name{outcome} in reg.
func counterOf(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
