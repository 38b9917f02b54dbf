package projector_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestReadOnlySessionsAreDropped opens the member's sessions while its
// role has default_transaction_read_only on, then turns it off. A session
// keeps the setting it began with, so a pool that reused the sessions
// that refused writes (25006) would retry them for as long as they lived:
// each is dropped instead, the new ones write, and every record lands.
// The pool holds one connection, so that no session opened after the
// setting changes could hide the stale one.
func TestReadOnlySessionsAreDropped(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 200
	f := faultSetup(t, opts, 2)
	admin := f.db.Pool
	role := "ro_" + f.db.Schema
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + f.db.Schema + ` TO ` + role,
		`GRANT ALL ON ALL TABLES IN SCHEMA ` + f.db.Schema + ` TO ` + role,
		`GRANT ALL ON ALL SEQUENCES IN SCHEMA ` + f.db.Schema + ` TO ` + role,
		`ALTER ROLE ` + role + ` SET default_transaction_read_only = on`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { // after the member's pool has closed
		ctx := context.Background()
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(f.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	q := u.Query()
	q.Set("pool_max_conns", "1")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	half := len(f.records) / 2
	f.produce(t, f.records[:half])

	reg := prometheus.NewRegistry()
	run(t, f.engine(t, "readonly", projector.Config{Partition: fastRetry, Registerer: reg, Store: postgres.NewStore(pool)}))
	sessions := func() bool {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	// Claims refused first: the member claims its partitions on sessions
	// opened read-only.
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("the member's session opened read-only", sessions))
	readWrite := func() {
		t.Helper()
		if _, err := admin.Exec(ctx, `ALTER ROLE `+role+` RESET default_transaction_read_only`); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := demo.WaitCommitted(wctx, admin, "readonly", f.kafka.Topic, f.end, nil); err != nil {
			t.Fatalf("after read-only was turned off: %v", err)
		}
	}
	readWrite()

	// Then batches refused: the session is replaced (as after a
	// failover) by one opened read-only, and the rest of the records come.
	if _, err := admin.Exec(ctx, `ALTER ROLE `+role+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role); err != nil {
		t.Fatal(err)
	}
	retried := counter(t, reg, "projector_retries_total")
	f.produce(t, f.records[half:])
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("a batch refused by a read-only session", func() bool {
		return counter(t, reg, "projector_retries_total") > retried && sessions()
	}))
	readWrite()
	if err := demo.Verify(ctx, admin, demo.Table, demo.Fold(f.records)); err != nil {
		t.Fatal(err)
	}
}
