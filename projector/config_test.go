package projector_test

import (
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
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
