package projector

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Consumer group protocols (Config.GroupProtocol), as Kafka's
// group.protocol names them.
const (
	// GroupProtocolClassic: the members assign the partitions among
	// themselves (JoinGroup and SyncGroup, with the cooperative-sticky
	// balancer).
	GroupProtocolClassic = "classic"
	// GroupProtocolConsumer: KIP-848, the brokers' group coordinator
	// assigns the partitions and hands them over on the members'
	// heartbeats (ConsumerGroupHeartbeat, Kafka 4.0 or later).
	GroupProtocolConsumer = "consumer"
)

// protocolWatch tells which group protocol the client speaks from the
// requests it writes. franz-go does not say whether it runs a KIP-848
// group, and falls back to the classic protocol when the brokers do not
// offer ConsumerGroupHeartbeat v1 or answer it UNSUPPORTED_VERSION (the
// protocol turned off on brokers that have it, which their ApiVersions
// does not show): the requests tell both cases apart, exactly. With the
// consumer protocol asked for, the first JoinGroup is warned about once.
type protocolWatch struct {
	want string
	log  *slog.Logger

	heartbeat atomic.Bool // a ConsumerGroupHeartbeat was written
	joinGroup atomic.Bool // a JoinGroup was written
	warned    sync.Once
}

var _ kgo.HookBrokerWrite = (*protocolWatch)(nil)

// OnBrokerWrite implements kgo.HookBrokerWrite.
func (w *protocolWatch) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	switch kmsg.Key(key) {
	case kmsg.ConsumerGroupHeartbeat:
		w.heartbeat.Store(true)
	case kmsg.JoinGroup:
		w.joinGroup.Store(true)
		if w.want == GroupProtocolConsumer {
			w.warned.Do(w.warnFallback)
		}
	}
}

// warnFallback says that the consumer protocol was asked for and the
// member joins with the classic one, and why.
func (w *protocolWatch) warnFallback() {
	why := "the brokers do not offer it (ConsumerGroupHeartbeat v1 needs Kafka 4.0 or later)"
	if w.heartbeat.Load() {
		why = "the brokers refused it as unsupported: they have it turned off (the group.version feature, or group.coordinator.rebalance.protocols without consumer)"
	}
	w.log.Warn("group protocol consumer (KIP-848) not used: "+why+"; the member uses the classic protocol, with its session timeout",
		"group_protocol", GroupProtocolClassic)
}

// inUse is the group protocol the member speaks, "" before it has tried
// to join.
func (w *protocolWatch) inUse() string {
	switch {
	case w.joinGroup.Load():
		return GroupProtocolClassic
	case w.heartbeat.Load():
		return GroupProtocolConsumer
	}
	return ""
}

// inGroup reports whether the client is a member of its group. A KIP-848
// member makes up its member id and has epoch 0 until the coordinator
// answers its first heartbeat, and returns to 0 when it rejoins; a
// classic member's generation is -1 until its first join completes, and
// a completed join's generation is at least 1.
func inGroup(cl *kgo.Client) bool {
	_, gen := cl.GroupMetadata()
	return gen > 0
}
