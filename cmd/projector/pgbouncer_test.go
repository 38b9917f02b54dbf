package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
)

// pgBouncer is a PgBouncer process of the test's own in front of the test
// PostgreSQL.
type pgBouncer struct {
	port int
	out  *syncBuffer
}

// startPgBouncer starts PgBouncer with pool_mode mode, at most poolSize
// server sessions per user and database, trusting users; it is stopped
// when the test ends.
func startPgBouncer(t *testing.T, mode string, poolSize int, users ...string) *pgBouncer {
	t.Helper()
	return startPgBouncerWith(t, mode, poolSize, "", users...)
}

// startPgBouncerWith is startPgBouncer with extra lines in its [pgbouncer]
// section.
func startPgBouncerWith(t *testing.T, mode string, poolSize int, extra string, users ...string) *pgBouncer {
	t.Helper()
	// Debian installs it in /usr/sbin, which not every PATH holds.
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			t.Skip("pgbouncer is not installed (Debian package pgbouncer)")
		}
	}
	up, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var auth strings.Builder
	for _, u := range append([]string{up.User.Username()}, users...) {
		fmt.Fprintf(&auth, "%q \"\"\n", u)
	}
	authFile := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(authFile, []byte(auth.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// The free port found may be taken before PgBouncer binds it: a
	// start that exits before it listens is tried again on another.
	for attempt := 1; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ini := filepath.Join(dir, "pgbouncer.ini")
		conf := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 200
%s
`, up.Hostname(), cmp.Or(up.Port(), "5432"), port, authFile, mode, poolSize, extra)
		if err := os.WriteFile(ini, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{ini}
		if os.Geteuid() == 0 {
			// PgBouncer refuses to run as root; it reads its files first.
			args = []string{"-u", "nobody", ini}
		}
		p := &pgBouncer{port: port, out: &syncBuffer{}}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = p.out, p.out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-done
		})
		var exited error
		testenv.WaitFor(t, 10*time.Second, func() error {
			select {
			case err := <-done:
				done <- err // for the cleanup
				exited = fmt.Errorf("pgbouncer exited: %v\n%s", err, p.out)
				return nil
			default:
			}
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			return c.Close()
		})
		switch {
		case exited == nil:
			return p
		case attempt == 3:
			t.Fatal(exited)
		}
	}
}

// url is db's URL with PgBouncer's address, as user (the URL's when
// empty), with query's parameters in place of the URL's (search_path among
// them).
func (p *pgBouncer) url(t *testing.T, db *testenv.DB, user string, query url.Values) string {
	t.Helper()
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", p.port)
	if user != "" {
		u.User = url.User(user)
	}
	query.Set("sslmode", "disable")
	u.RawQuery = query.Encode()
	return u.String()
}

// pgbRole creates a superuser role whose sessions have settings (ALTER
// ROLE ... SET name = value, in pairs): behind transaction pooling the
// server's sessions can have no others. It is dropped when the test ends.
func pgbRole(t *testing.T, db *testenv.DB, settings ...string) string {
	t.Helper()
	ctx := t.Context()
	role := "pgb_" + db.Schema
	stmts := []string{"CREATE ROLE " + role + " LOGIN SUPERUSER"}
	for i := 0; i+1 < len(settings); i += 2 {
		stmts = append(stmts, fmt.Sprintf("ALTER ROLE %s SET %s = '%s'", role, settings[i], settings[i+1]))
	}
	for _, s := range stmts {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, s := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	})
	return role
}

// TestPgBouncerTransactionPooling shows what transaction pooling does to
// a client's session state, with one server session for two clients: the
// second client holds the first's advisory lock too (the relay's shard
// locks would not exclude anyone), and a statement pgx prepares by name
// for one client is already there for the other, so its own preparation
// fails; unnamed statements (pgx's cache_describe mode) do not.
func TestPgBouncerTransactionPooling(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	p := startPgBouncer(t, "transaction", 1)
	connect := func(mode string) [2]*pgx.Conn {
		var cs [2]*pgx.Conn
		for i := range cs {
			c, err := pgx.Connect(ctx, p.url(t, db, "", url.Values{"default_query_exec_mode": {mode}}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close(context.Background()) })
			cs[i] = c
		}
		return cs
	}

	cs := connect("cache_statement")
	for i, c := range cs {
		var got bool
		if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock(4242, 1)`).Scan(&got); err != nil && i == 0 {
			t.Fatal(err)
		} else if err == nil && !got {
			t.Errorf("client %d was refused the advisory lock: transaction pooling kept the other client's session apart", i+1)
		}
	}
	var n int
	err := cs[1].QueryRow(ctx, `SELECT 1 + $1::int`, 1).Scan(&n)
	if err == nil {
		err = cs[0].QueryRow(ctx, `SELECT 1 + $1::int`, 1).Scan(&n)
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "42P05" { // duplicate_prepared_statement
		t.Errorf("a statement prepared by name by two clients of one server session: got %v, want duplicate_prepared_statement", err)
	}

	for i, c := range connect("cache_describe") {
		if err := c.QueryRow(ctx, `SELECT 2 + $1::int`, 1).Scan(&n); err != nil {
			t.Errorf("client %d, unnamed statements: %v", i+1, err)
		}
	}
}

// TestPgBouncerRun runs projector run through PgBouncer in each pooling
// mode, with a pool smaller than the member's, so that behind transaction
// pooling its connections share server sessions; the table must equal
// the reference fold. Behind the session pool the URL's search_path and
// the session flags are set after connecting; behind the transaction
// pool they are the role's, as docs/operations.md says, and nothing is
// warned.
func TestPgBouncerRun(t *testing.T) {
	for _, mode := range []string{poolerSession, poolerTransaction} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			opts := demo.DefaultOptions()
			opts.Aggregates, opts.Seed = 400, 5
			cs := newCrashStream(t, 4, opts, demo.Projections, "50", projector.GroupProtocolClassic)
			var dbURL string
			switch mode {
			case poolerSession:
				p := startPgBouncer(t, mode, 12)
				dbURL = p.url(t, cs.db, "", url.Values{"search_path": {cs.db.Schema}})
			case poolerTransaction:
				role := pgbRole(t, cs.db, "search_path", cs.db.Schema, "lock_timeout", "5s", "idle_in_transaction_session_timeout", "15s")
				p := startPgBouncer(t, mode, 3, role)
				dbURL = p.url(t, cs.db, role, url.Values{})
			}
			args := withFlags(cs.args, map[string]string{"database-url": dbURL, "database-pooler": mode})
			began := time.Now()
			c := startChild(t, args...)
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			if err := demo.WaitCommitted(wctx, cs.db.Pool, crashIdentity, cs.topic, cs.end, nil); err != nil {
				t.Fatalf("%v\nprojector stderr:\n%s", err, c.stderr)
			}
			t.Logf("%d records committed through %s pooling in %s", len(cs.records), mode, time.Since(began).Round(time.Millisecond))
			if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := <-c.done; err != nil {
				t.Errorf("projector did not stop cleanly on SIGTERM: %v\n%s", err, c.stderr)
			}
			c.done <- nil
			if err := demo.Verify(ctx, cs.db.Pool, demo.Table, demo.Fold(cs.records)); err != nil {
				t.Fatal(err)
			}
			if s := c.stderr.String(); strings.Contains(s, "session setting") || strings.Contains(s, "prepared statement") {
				t.Errorf("projector warned of its session:\n%s", s)
			}
		})
	}
}

// TestPgBouncerRefused: a command whose --database-pooler does not fit
// what --database-url leads to refuses to start, with one error naming
// the problem and the fix.
func TestPgBouncerRefused(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 10
	cs := newCrashStream(t, 1, opts, demo.Projections, "50", projector.GroupProtocolClassic)
	session := startPgBouncer(t, "session", 4)
	bareRole := pgbRole(t, cs.db, "search_path", cs.db.Schema) // nor lock_timeout nor idle_in_transaction_session_timeout
	transaction := startPgBouncer(t, "transaction", 4, bareRole)
	ignoring := startPgBouncerWith(t, "session", 4, "ignore_startup_parameters = lock_timeout,idle_in_transaction_session_timeout,search_path")
	withPath := url.Values{"search_path": {cs.db.Schema}}
	relayArgs := []string{"relay", "--brokers", cs.broker, "--http-addr", "", "--startup-timeout", "10s"}
	// Behind transaction pooling, settings the role lacks are warned of,
	// with the statement that sets them. (First: a session pool's SET
	// below stays on the server sessions it ran on.)
	var out syncBuffer
	args := []string{"migrate", "--database-url", transaction.url(t, cs.db, bareRole, url.Values{}), "--database-pooler", "transaction",
		"--config", cs.args[slices.Index(cs.args, "--config")+1]}
	if err := Main(ctx, args, &out, &out); err != nil {
		t.Fatalf("migrate through the transaction pool: %v\n%s", err, out.String())
	}
	for _, w := range []string{"lock_timeout", "idle_in_transaction_session_timeout", "ALTER ROLE " + bareRole + " SET lock_timeout = '5s'"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("migrate behind transaction pooling did not warn of %q:\n%s", w, out.String())
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"run, session pool, no --database-pooler",
			withFlags(cs.args, map[string]string{"database-url": session.url(t, cs.db, "", withPath)}),
			[]string{"as a startup parameter", "--database-pooler session or --database-pooler transaction"}},
		{"run, session pool ignoring the settings, no --database-pooler",
			withFlags(cs.args, map[string]string{"database-url": ignoring.url(t, cs.db, "", withPath)}),
			[]string{"not the", "this command asked for when connecting", "ignore_startup_parameters", "--database-pooler session or --database-pooler transaction"}},
		{"run, transaction pool, no --database-pooler",
			withFlags(cs.args, map[string]string{"database-url": transaction.url(t, cs.db, bareRole, url.Values{})}),
			[]string{"as a startup parameter", "--database-pooler session or --database-pooler transaction"}},
		{"run, transaction pool, --database-pooler session",
			withFlags(cs.args, map[string]string{"database-url": transaction.url(t, cs.db, bareRole, url.Values{}), "database-pooler": "session"}),
			[]string{"leads through transaction pooling", "say --database-pooler transaction"}},
		{"run, transaction pool, search_path in the URL",
			withFlags(cs.args, map[string]string{"database-url": transaction.url(t, cs.db, "", withPath), "database-pooler": "transaction"}),
			[]string{"search_path", "cannot be set per connection behind transaction pooling", "ALTER ROLE"}},
		{"run, transaction pool, named statements in the URL",
			withFlags(cs.args, map[string]string{"database-url": transaction.url(t, cs.db, bareRole, url.Values{"default_query_exec_mode": {"cache_statement"}}), "database-pooler": "transaction"}),
			[]string{"default_query_exec_mode=cache_statement", "cache_describe"}},
		{"run, --database-pooler transaction, --dlq-topic",
			withFlags(cs.args, map[string]string{"database-url": transaction.url(t, cs.db, bareRole, url.Values{}), "database-pooler": "transaction", "dlq-topic": "accounts.dlq"}),
			[]string{"--dlq-topic accounts.dlq", dlqNeedsSession}},
		{"relay, --database-pooler transaction",
			append(relayArgs, "--database-url", transaction.url(t, cs.db, bareRole, url.Values{}), "--database-pooler", "transaction"),
			[]string{relayNeedsSession}},
		{"relay, transaction pool, no --database-pooler",
			append(relayArgs, "--database-url", transaction.url(t, cs.db, bareRole, url.Values{})),
			[]string{"leads through transaction pooling", relayNeedsSession}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out syncBuffer
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err := Main(cctx, tc.args, &out, &out)
			if err == nil {
				t.Fatalf("projector %s started:\n%s", strings.Join(tc.args, " "), out.String())
			}
			t.Logf("refused: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") && !strings.Contains(tc.want[0], "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}

}

// TestPgBouncerRelay runs two relay processes through PgBouncer's session
// pool: one with --database-pooler session and search_path in its URL,
// one without the flag, its search_path the role's (a URL without
// settings needs no flag), and appends events for 100
// aggregates meanwhile: each must be published exactly once, in version
// order per aggregate, the two relays sharing the shards.
func TestPgBouncerRelay(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.NewCluster(t, demo.Topic, 4)
	reg := testenv.NewRegistry(t)
	enc, err := demo.RegisterSchemasFor(ctx, reg.Client, cluster.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	role := pgbRole(t, db, "search_path", db.Schema)
	p := startPgBouncer(t, "session", 6, role)
	base := []string{"relay",
		"--brokers", cluster.Brokers(),
		"--registry-url", reg.URL,
		"--http-addr", "",
		"--batch-size", "20",
		"--poll-interval", "200ms",
		"--shards", "8",
		"--log-level", "warn",
	}
	relays := []*child{
		startChild(t, append(base, "--database-url", p.url(t, db, "", url.Values{"search_path": {db.Schema}}), "--database-pooler", "session")...),
		startChild(t, append(base, "--database-url", p.url(t, db, role, url.Values{}))...),
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		for i, c := range relays {
			select {
			case err := <-c.done:
				c.done <- err // for the cleanup
				t.Fatalf("relay %d exited: %v\n%s", i+1, err, c.stderr)
			default:
			}
		}
		owners, err := outbox.ShardOwners(ctx, db.Pool)
		if err != nil {
			return err
		}
		per := map[int32]int{}
		for _, pid := range owners {
			per[pid]++
		}
		if len(owners) != 8 || len(per) != 2 {
			return fmt.Errorf("shard owners %v: want the 8 shards shared by two relays", owners)
		}
		return nil
	})

	const aggregates, versions = 100, 5
	ids := map[string]bool{}
	for v := int64(1); v <= versions; v++ {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var evs []outbox.Event
			for a := range aggregates {
				e := accountEvent(t, enc, fmt.Sprintf("acc-%03d", a), v, a%2 == 0)
				e.ID = fmt.Sprintf("%03d-%d", a, v)
				ids[e.ID] = true
				evs = append(evs, e)
			}
			return outbox.Append(ctx, tx, evs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, time.Minute, func() error {
		var pending int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox WHERE published_at IS NULL`).Scan(&pending); err != nil {
			return err
		}
		if pending > 0 {
			return fmt.Errorf("%d events unpublished; relay stderr:\n%s\n---\n%s", pending, relays[0].stderr, relays[1].stderr)
		}
		return nil
	})
	for i, c := range relays {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-c.done; err != nil {
			t.Errorf("relay %d did not stop cleanly on SIGTERM: %v\n%s", i+1, err, c.stderr)
		}
		c.done <- nil
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.Addrs()...), kgo.ConsumeTopics(cluster.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(rctx, cluster.Topic)
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	dec := schemas.NewDecoder(reg.Client, nil)
	seen, last := map[string]int{}, map[string]int64{}
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			t.Fatalf("reading the topic: %v", rctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; !ok {
				return
			} else if r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			var id string
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderCEID {
					id = string(h.Value)
				}
			}
			v, _, err := dec.Decode(rctx, r.Value)
			if err != nil {
				t.Fatalf("record %s at %d/%d: %v", r.Key, r.Partition, r.Offset, err)
			}
			key, version := string(r.Key), v["version"].(int64)
			seen[id]++
			if version != last[key]+1 {
				t.Errorf("aggregate %s: version %d published after version %d", key, version, last[key])
			}
			last[key] = version
		})
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("event %s published %d times, want once", id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("%d distinct events in Kafka, %d appended", len(seen), len(ids))
	}
}
