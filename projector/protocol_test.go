package projector_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// groupProtocols are the consumer group protocols the group tests run
// under.
var groupProtocols = []string{projector.GroupProtocolClassic, projector.GroupProtocolConsumer}

// quickGroups has the embedded broker heartbeat KIP-848 members every
// 100ms and expire them after 6s, the session timeout the classic tests
// give their members (Kafka's defaults are 5s and 45s; scripts/kafka sets
// 1s and 10s on a real cluster). The coordinator hands partitions over on
// heartbeats: at 5s every move would take seconds.
var quickGroups = testenv.FakeOpts(kfake.BrokerConfigs(map[string]string{
	"group.consumer.heartbeat.interval.ms": "100",
	"group.consumer.session.timeout.ms":    "6000",
}))

// groupConfig is a member's config for a test of group membership under
// protocol: the classic members' session timeout is 6s, as quickGroups
// sets the KIP-848 one.
func groupConfig(protocol string, cfg projector.Config) projector.Config {
	cfg.GroupProtocol = protocol
	if protocol == projector.GroupProtocolClassic {
		cfg.SessionTimeout = 6 * time.Second
	}
	return cfg
}

// assertGroupProtocol fails t unless group is a group of protocol: a
// KIP-848 group is described by ConsumerGroupDescribe (with its members
// and the coordinator's assignor), a classic one is not. On the embedded
// broker reqs also counts the requests: a member of a consumer group never
// sent JoinGroup, one of a classic group never ConsumerGroupHeartbeat.
func assertGroupProtocol(t *testing.T, b *bundle, reqs *groupRequests, group, protocol string) {
	t.Helper()
	adm := kadm.NewClient(b.kafkaClient(t))
	described, err := adm.DescribeConsumerGroups(t.Context(), group)
	if err != nil {
		t.Fatalf("describe consumer group %s: %v", group, err)
	}
	d := described[group]
	switch protocol {
	case projector.GroupProtocolConsumer:
		if d.Err != nil || d.AssignorName != "uniform" {
			t.Errorf("group %s: described as a KIP-848 group with error %v and assignor %q, want one with the coordinator's uniform assignor", group, d.Err, d.AssignorName)
		}
	default:
		if !errors.Is(d.Err, kerr.GroupIDNotFound) {
			t.Errorf("group %s: described as a KIP-848 group (error %v, %d members), want a classic group", group, d.Err, len(d.Members))
		}
	}
	if reqs == nil {
		return
	}
	joins, heartbeats := reqs.joins.Load(), reqs.heartbeats.Load()
	switch protocol {
	case projector.GroupProtocolConsumer:
		if joins > 0 || heartbeats == 0 {
			t.Errorf("%d JoinGroup and %d ConsumerGroupHeartbeat requests, want none of the first and some of the second", joins, heartbeats)
		}
	default:
		if joins == 0 || heartbeats > 0 {
			t.Errorf("%d JoinGroup and %d ConsumerGroupHeartbeat requests, want some of the first and none of the second", joins, heartbeats)
		}
	}
}

// groupMembers returns the members and the state of group, a group of
// protocol.
func groupMembers(t *testing.T, b *bundle, group, protocol string) (int, string) {
	t.Helper()
	adm := kadm.NewClient(b.kafkaClient(t))
	if protocol == projector.GroupProtocolConsumer {
		described, err := adm.DescribeConsumerGroups(t.Context(), group)
		if err == nil {
			err = described[group].Err
		}
		if err != nil {
			t.Fatalf("describe consumer group %s: %v", group, err)
		}
		return len(described[group].Members), described[group].State
	}
	described, err := adm.DescribeGroups(t.Context(), group)
	if err == nil {
		err = described[group].Err
	}
	if err != nil {
		t.Fatalf("describe group %s: %v", group, err)
	}
	return len(described[group].Members), described[group].State
}

// groupRequests counts the embedded broker's requests of each protocol.
type groupRequests struct{ joins, heartbeats atomic.Int64 }

func countGroupRequests(c *kfake.Cluster) *groupRequests {
	r := &groupRequests{}
	c.ControlKey(int16(kmsg.JoinGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.joins.Add(1)
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.heartbeats.Add(1)
		return nil, nil, false
	})
	return r
}

// processedOnce fails t unless the members whose metrics are in regs
// committed the outcome of every record exactly once between them (a
// batch abandoned or fenced counts nothing): as many outcomes as records,
// and as many stale ones as the stream has copies. A record committed by
// two owners would count twice, the second time as stale.
func processedOnce(t *testing.T, records []demo.Record, regs ...*prometheus.Registry) {
	t.Helper()
	exp := demo.Fold(records)
	var total, stale float64
	for _, reg := range regs {
		total += counter(t, reg, "projector_records_processed_total")
		stale += sample(t, reg, "projector_records_processed_total", map[string]string{"outcome": "stale"})
	}
	if total != float64(len(records)) || stale != float64(exp.Stale) {
		t.Errorf("the members committed the outcomes of %v records, %v of them stale; want %d and %d: each record once", total, stale, len(records), exp.Stale)
	}
}

// TestGroupProtocolWarnings runs a member asking for the consumer
// protocol against brokers that offer it, that do not (Kafka 3.x: no
// ConsumerGroupHeartbeat v1) and that refuse it (turned off: the broker
// answers UNSUPPORTED_VERSION), and with a session timeout it cannot use:
// it joins with the protocol the brokers allow, says why at most once, and
// projects the stream.
func TestGroupProtocolWarnings(t *testing.T) {
	const (
		notUsed        = "group protocol consumer (KIP-848) not used"
		notOffered     = notUsed + ": the brokers do not offer it"
		refused        = notUsed + ": the brokers refused it"
		sessionIgnored = "the session timeout given (--session-timeout, SessionTimeout) does not apply"
	)
	noV1 := kversion.Stable()
	noV1.SetMaxKeyVersion(int16(kmsg.ConsumerGroupHeartbeat), -1)
	for _, tc := range []struct {
		name           string
		cluster        []testenv.ClusterOpt
		refuse         bool // ConsumerGroupHeartbeat is answered UNSUPPORTED_VERSION
		sessionTimeout time.Duration
		protocol       string // the protocol the member joins with
		warning        string // logged once; "" none
	}{
		{name: "offered", protocol: projector.GroupProtocolConsumer},
		{name: "session timeout given", sessionTimeout: 6 * time.Second, protocol: projector.GroupProtocolConsumer, warning: sessionIgnored},
		{name: "not offered", cluster: []testenv.ClusterOpt{testenv.FakeOpts(kfake.MaxVersions(noV1))}, protocol: projector.GroupProtocolClassic, warning: notOffered},
		{name: "turned off", refuse: true, protocol: projector.GroupProtocolClassic, warning: refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := demo.DefaultOptions()
			opts.Aggregates = 200
			b := faultSetup(t, opts, 2, tc.cluster...).bundle
			b.produce(t, b.records)
			fake := b.kafka.Embedded("counts the group requests, and makes brokers refuse the consumer protocol")
			reqs := countGroupRequests(fake)
			if tc.refuse {
				fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
					fake.KeepControl()
					resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
					resp.ErrorCode = kerr.UnsupportedVersion.Code
					return resp, nil, true
				})
			}
			logs := &lockedBuffer{}
			run(t, b.engine(t, "warned", projector.Config{
				GroupProtocol:  projector.GroupProtocolConsumer,
				SessionTimeout: tc.sessionTimeout,
				Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
			}))
			b.verify(t, "warned")
			for _, w := range []string{notUsed, sessionIgnored} {
				want := 0
				if strings.HasPrefix(tc.warning, w) {
					want = 1
				}
				if n := strings.Count(logs.String(), w); n != want || want == 1 && !strings.Contains(logs.String(), tc.warning) {
					t.Errorf("%d warnings %q, want %d %q:\n%s", n, w, want, tc.warning, logs)
				}
			}
			if tc.refuse {
				// It asked first, and was refused.
				if reqs.heartbeats.Load() == 0 {
					t.Errorf("no ConsumerGroupHeartbeat: the member did not ask for the consumer protocol")
				}
				reqs = nil
			}
			assertGroupProtocol(t, b, reqs, "warned", tc.protocol)
		})
	}
}
