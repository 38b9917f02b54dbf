package projector_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestEngineWithTypesAsPostgresNamesThem runs the demo stream into a
// projection whose column types are written as Postgres accepts them but
// not as it prints them (upper case, aliases, modifiers, a domain of a
// schema off search_path, multi-word names): every statement the engine
// runs uses the names Postgres resolved them to, and the table equals the
// reference fold.
func TestEngineWithTypesAsPostgresNamesThem(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 800
	b := setup(t, opts, 3)
	other := testenv.NewDB(t) // a schema that is not on the engine's search_path
	if _, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE DOMAIN %s.owner_name AS text`, other.Schema)); err != nil {
		t.Fatal(err)
	}
	src := strings.NewReplacer(
		"table: accounts", "table: accounts_typed",
		"account_id: {type: text, primary_key: true}", "account_id: {type: VARCHAR(64), primary_key: true}",
		"owner:      {type: text}", "owner:      {type: "+other.Schema+".owner_name}",
		"balance:    {type: bigint, default: 0}", "balance:    {type: INT8, default: 0}",
		"opened_at:  {type: timestamptz}", "opened_at:  {type: timestamp(6) WITH TIME ZONE}",
	).Replace(string(demo.Projections))
	projs, err := projection.Parse([]byte(src), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, b.db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, c := range projs[0].Columns {
		types = append(types, c.Type)
	}
	if want := []string{"character varying(64)", other.Schema + ".owner_name", "bigint", "timestamp(6) with time zone"}; fmt.Sprint(types) != fmt.Sprint(want) {
		t.Errorf("column types %q, want %q", types, want)
	}
	b.projs = projs
	stop := run(t, b.engine(t, "typed", projector.Config{}))
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, b.db.Pool, "typed", b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	stop()
	exp := demo.Fold(b.records)
	if err := demo.Verify(ctx, b.db.Pool, "accounts_typed", exp); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, b.db.Pool, "typed", exp)
}
