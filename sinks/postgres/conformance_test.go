package postgres_test

import (
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks/postgres"
	"github.com/projector-dev/projector/sinks/sinktest"
)

// The Postgres sink keeps the promises of the sinks contract.
func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T) sinktest.Store {
		db := testenv.NewDB(t)
		if err := postgres.Migrate(t.Context(), db.Pool, sinktest.Projections()...); err != nil {
			t.Fatal(err)
		}
		return postgres.NewStore(db.Pool)
	})
}
