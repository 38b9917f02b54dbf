package projector_test

import (
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/memsink"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// An engine without a store of sinks and offsets is refused at once,
// naming the field, rather than failing at its first batch.
func TestConfigWithoutStoreNamesTheField(t *testing.T) {
	projs, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatal(err)
	}
	_, err = projector.New(projector.Config{Brokers: []string{"127.0.0.1:1"}, Identity: "nostore", Projections: projs},
		func(*projection.Projection) partition.Decoder { return nil })
	if err == nil || !strings.Contains(err.Error(), "Store") {
		t.Fatalf("New without a Store: %v, want an error naming Store", err)
	}
}

// plainStore hands out sinks that commit one projection at a time only.
type plainStore struct{ *memsink.Store }

type plainSink struct{ sinks.Sink }

func (s plainStore) Sink(t sinks.Target) (sinks.Sink, error) {
	k, err := s.Store.Sink(t)
	return plainSink{k}, err
}

// Projections sharing a topic are refused at New, naming them, when one
// has on_gap repair (a partition has one repair loop) or when the store
// cannot commit them together; otherwise they are taken.
func TestConfigSharedTopic(t *testing.T) {
	parse := func(t *testing.T) []*projection.Projection {
		t.Helper()
		a, err := projection.Parse(demo.Projections, ".")
		if err != nil {
			t.Fatal(err)
		}
		b, err := projection.Parse(demo.SnapshotProjections, ".")
		if err != nil {
			t.Fatal(err)
		}
		return append(a, b...)
	}
	newEngine := func(projs []*projection.Projection, store projector.Store) error {
		_, err := projector.New(projector.Config{Brokers: []string{"127.0.0.1:1"}, Identity: "shared", Projections: projs, Store: store},
			func(*projection.Projection) partition.Decoder { return nil })
		return err
	}
	if err := newEngine(parse(t), memsink.New(nil)); err != nil {
		t.Errorf("two projections of one topic: %v", err)
	}
	projs := parse(t)
	projs[1].OnGap, projs[1].Repair = projection.GapRepair, &projection.RepairSpec{HTTPURL: "http://source/{key}"}
	if err := newEngine(projs, memsink.New(nil)); err == nil || !strings.Contains(err.Error(), "on_gap repair") || !strings.Contains(err.Error(), `"last_event"`) {
		t.Errorf("repair on a shared topic: %v, want it refused naming the projection", err)
	}
	if err := newEngine(parse(t), plainStore{memsink.New(nil)}); err == nil || !strings.Contains(err.Error(), "LaneCommitter") || !strings.Contains(err.Error(), demo.Topic) {
		t.Errorf("a store that cannot commit projections together: %v, want it refused naming the topic", err)
	}
}

// A storm guard setting without a meaning is refused, naming the field.
func TestConfigStormGuardNamesTheField(t *testing.T) {
	projs, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatal(err)
	}
	for field, cfg := range map[string]partition.Config{
		"DeadLetterStormShare":  {DeadLetterStormShare: 1.5},
		"DeadLetterStormWindow": {DeadLetterStormWindow: -1},
	} {
		_, err = projector.New(projector.Config{Brokers: []string{"127.0.0.1:1"}, Identity: "storm", Projections: projs,
			Store: postgres.NewStore(nil), Partition: cfg}, func(*projection.Projection) partition.Decoder { return nil })
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("New with %+v: %v, want an error naming %s", cfg, err, field)
		}
	}
}

// A group protocol Kafka does not have is refused, naming the field; the
// two it has are taken, classic when none is given.
func TestConfigGroupProtocol(t *testing.T) {
	projs, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatal(err)
	}
	for protocol, ok := range map[string]bool{"": true, "classic": true, "consumer": true, "eager": false, "Consumer": false} {
		_, err := projector.New(projector.Config{Brokers: []string{"127.0.0.1:1"}, Identity: "protocol", Projections: projs,
			Store: memsink.New(nil), GroupProtocol: protocol}, func(*projection.Projection) partition.Decoder { return nil })
		switch {
		case ok && err != nil:
			t.Errorf("GroupProtocol %q: %v", protocol, err)
		case !ok && (err == nil || !strings.Contains(err.Error(), "GroupProtocol") || !strings.Contains(err.Error(), "want classic or consumer")):
			t.Errorf("GroupProtocol %q: %v, want an error naming GroupProtocol and the protocols", protocol, err)
		}
	}
}
