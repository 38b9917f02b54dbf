package memsink_test

import (
	"testing"

	"github.com/projector-dev/projector/internal/memsink"
	"github.com/projector-dev/projector/sinks/sinktest"
)

// The in-memory sink keeps the promises of the sinks contract.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(*testing.T) sinktest.Store { return memsink.New(nil) })
}
