package projector_test

import (
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
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
