package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
)

// TestDemoDropsOnlyItsOwnSchema points the demo at schemas of another
// application: public and one the demo did not create. It must refuse
// both, saying why, and leave their tables as they were; a schema it
// created itself it recreates on the next run. The test has a server of
// its own, so that a demo that did drop public drops nobody else's.
func TestDemoDropsOnlyItsOwnSchema(t *testing.T) {
	ctx := t.Context()
	srv := testenv.StartPostgres(t)
	db := srv.DB(t)
	for _, q := range []string{
		`CREATE TABLE public.orders (id int PRIMARY KEY)`,
		`INSERT INTO public.orders SELECT generate_series(1, 50)`,
		`CREATE SCHEMA billing`,
		`CREATE TABLE billing.invoices (id int PRIMARY KEY)`,
		`INSERT INTO billing.invoices VALUES (1), (2), (3)`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	count := func(table string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatalf("the application's table %s: %v", table, err)
		}
		return n
	}

	for _, tc := range []struct{ schema, want string }{
		{"public", "--database-schema public: the demo drops and recreates its schema, so it never uses public"},
		{"billing", "--database-schema billing: the schema exists and was not created by projector demo"},
	} {
		var out bytes.Buffer
		err := Main(ctx, []string{"demo", "--database-url", srv.URL, "--database-schema", tc.schema, "--aggregates", "20", "--timeout", "1m"}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("demo --database-schema %s: got error %v, want one saying %q\n%s", tc.schema, err, tc.want, &out)
		}
	}
	if n := count("public.orders"); n != 50 {
		t.Errorf("public.orders has %d rows after the demo, want its 50", n)
	}
	if n := count("billing.invoices"); n != 3 {
		t.Errorf("billing.invoices has %d rows after the demo, want its 3", n)
	}

	// The demo's own schema: created and marked on the first run,
	// dropped and recreated on the next.
	f := &demoFlags{databaseURL: srv.URL, schema: "projector_demo"}
	pool, err := demoDatabase(ctx, f)
	if err != nil {
		t.Fatalf("first demo schema: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE leftover (id int)`); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	pool, err = demoDatabase(ctx, f)
	if err != nil {
		t.Fatalf("the demo could not recreate its own schema: %v", err)
	}
	defer pool.Close()
	var leftover *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass('projector_demo.leftover')::text`).Scan(&leftover); err != nil {
		t.Fatal(err)
	}
	if leftover != nil {
		t.Error("the demo's schema was not recreated: the previous run's table is still there")
	}
}
