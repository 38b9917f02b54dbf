package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// fillSlots opens connections to url until PostgreSQL refuses one for
// want of a slot, and returns them (closed when the test ends).
func fillSlots(t *testing.T, url string) []*pgx.Conn {
	t.Helper()
	var held []*pgx.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close(context.Background())
		}
	})
	for range 200 {
		c, err := pgx.Connect(t.Context(), url)
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "53300" {
			return held
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	t.Fatal("PostgreSQL never ran out of connection slots")
	return nil
}

// withMaxConnections sets the private server's max_connections.
func withMaxConnections(t *testing.T, srv *testenv.PGServer, n int) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(t.Context(), fmt.Sprintf("ALTER SYSTEM SET max_connections = %d", n))
	conn.Close(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv.Restart(t)
}

// TestTooManyClients: a server out of connection slots gets a message of
// its own, with the sizing rule, instead of advice to start PostgreSQL;
// a pool larger than the server allows is refused before any table is
// created, and one larger than its free slots is warned about.
func TestTooManyClients(t *testing.T) {
	srv := testenv.StartPostgres(t)
	withMaxConnections(t, srv, 8)
	e := newRunEnv(t, 2, 300)
	e.onServer(t, srv)

	t.Run("no slot left", func(t *testing.T) {
		held := fillSlots(t, srv.URL)
		var out bytes.Buffer
		t.Setenv("PROJECTOR_STARTUP_TIMEOUT", "1s")
		err := Main(t.Context(), []string{"migrate", "--database-url", srv.URL, "--config", e.config}, &out, &out)
		if err == nil {
			t.Fatal("migrate succeeded on a server without a free connection slot")
		}
		for _, want := range []string{"too many clients", "--database-max-conns", "max_connections"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not say %q: %v", want, err)
			}
		}
		if strings.Contains(err.Error(), "Start PostgreSQL") {
			t.Errorf("error tells to start a PostgreSQL that runs: %v", err)
		}
		for _, c := range held {
			c.Close(t.Context())
		}
	})

	t.Run("pool larger than the server allows", func(t *testing.T) {
		var out bytes.Buffer
		err := Main(t.Context(), e.args("toolarge", "--database-max-conns", "9"), &out, &out)
		if err == nil || !strings.Contains(err.Error(), "--database-max-conns 9") || !strings.Contains(err.Error(), "max_connections 8") {
			t.Fatalf("got %v, want --database-max-conns 9 refused for max_connections 8\n%s", err, &out)
		}
		if tables := e.tables(t); len(tables) > 0 {
			t.Errorf("a refused run created tables %v", tables)
		}
	})

	t.Run("fewer free slots than the pool", func(t *testing.T) {
		var held []*pgx.Conn
		defer func() {
			for _, c := range held {
				c.Close(t.Context())
			}
		}()
		for range 5 {
			c, err := pgx.Connect(t.Context(), srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		r := start(t, e.args("crowded", "--database-max-conns", "4")...)
		testenv.WaitFor(t, 30*time.Second, func() error {
			r.running(t)
			if !strings.Contains(r.out.String(), "fewer free connection slots") {
				return fmt.Errorf("no warning about free connection slots yet:\n%s", r.out)
			}
			return nil
		})
		for _, want := range []string{`"database_max_conns":4`, `"free_slots":`, `"max_connections":8`} {
			if !strings.Contains(r.out.String(), want) {
				t.Errorf("the warning does not say %s:\n%s", want, r.out)
			}
		}
		for _, c := range held {
			c.Close(t.Context())
		}
		held = nil
		e.verify(t, "crowded", time.Minute, r.out)
	})
}

// TestDatabaseMaxConnsBoundsTheMember: a member given
// --database-max-conns 2 never holds more than two connections, however
// many partitions it works on, and still projects the whole stream.
func TestDatabaseMaxConnsBoundsTheMember(t *testing.T) {
	e := newRunEnv(t, 6, 3000)
	name := fmt.Sprintf("maxconns-%x", rand.Uint32())
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	args := e.args("maxconns", "--database-max-conns", "2", "--database-url", u.String())
	r := start(t, args...)
	most := 0
	testenv.WaitFor(t, 2*time.Minute, func() error {
		r.running(t)
		var n int
		if err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&n); err != nil {
			return err
		}
		most = max(most, n)
		if _, done, err := demo.Committed(t.Context(), e.db.Pool, "maxconns", demo.Topic, e.end); err != nil || !done {
			return errors.New("not all records committed yet")
		}
		return nil
	})
	e.verify(t, "maxconns", time.Minute, r.out)
	t.Logf("the member held at most %d connections at once", most)
	if most > 2 {
		t.Errorf("the member held %d connections at once, want at most 2 (--database-max-conns)", most)
	}
	if most == 0 {
		t.Errorf("no connection of the member was seen")
	}
}
