package projector_test

import (
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
)

// TestBrokerKilledMidStream kills one broker of three with SIGKILL while
// two members consume and the stream is still being produced (replication
// 3, min.insync.replicas 2, acks=all), and starts it again later:
// leadership moves, the group coordinator may move, fetches and commits
// go on through the other brokers, and the table equals the reference
// fold with every parked event and dead letter stored once.
func TestBrokerKilledMidStream(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 3000, 23
	f := faultSetup(t, opts, 6)
	f.kafka.Nodes(3)
	cfg := projector.Config{
		Partition:      partition.Config{BatchMaxRecords: 200, BatchMaxWait: 20 * time.Millisecond},
		SessionTimeout: 10 * time.Second,
	}
	run(t, f.engine(t, "brokers", cfg))
	run(t, f.engine(t, "brokers", cfg))

	third := len(f.records) / 3
	f.produce(t, f.records[:third])
	f.kafka.KillBroker(1)
	f.produce(t, f.records[third:2*third])
	f.kafka.StartBroker(1)
	f.kafka.KillBroker(2)
	f.produce(t, f.records[2*third:])
	f.kafka.StartBroker(2)
	f.verify(t, "brokers")
}
