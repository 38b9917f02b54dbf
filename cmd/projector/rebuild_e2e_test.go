package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/rebuild"
)

// rebuiltProjections is the demo's projection with a column added and
// its fold changed: each deposit is also counted.
var rebuiltProjections = strings.NewReplacer(
	"      opened_at:  {type: timestamptz}\n", "      opened_at:  {type: timestamptz}\n      deposits:   {type: bigint, default: 0}\n",
	"Deposited:     {add: {balance: amount}}", "Deposited:     {add: {balance: amount, deposits: {literal: 1}}}",
).Replace(string(demo.Projections))

// rebuildStream is a demo stream, part of it produced, with replicas of
// projector run as processes.
type rebuildStream struct {
	db       *testenv.DB
	cluster  *testenv.Cluster
	config   string
	records  []demo.Record
	topic    string
	args     []string
	newFile  string
	identity string
	prod     *kgo.Client
	enc      *demo.Encoder
	adm      *kadm.Client
}

func newRebuildStream(t *testing.T, opts demo.Options, partitions int, extra ...string) *rebuildStream {
	t.Helper()
	ctx := t.Context()
	rs := &rebuildStream{db: testenv.NewDB(t), records: demo.Generate(opts)}
	cluster := testenv.NewCluster(t, demo.Topic, partitions)
	rs.cluster, rs.topic, rs.identity = cluster, cluster.Topic, cluster.Name("rebuild-e2e")
	reg := testenv.NewRegistry(t)
	enc, err := demo.RegisterSchemasFor(ctx, reg.Client, rs.topic)
	if err != nil {
		t.Fatal(err)
	}
	rs.enc = enc
	if rs.prod, err = kgo.NewClient(kgo.SeedBrokers(cluster.Addrs()...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.prod.Close)
	rs.adm = kadm.NewClient(rs.prod)
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		content = strings.ReplaceAll(content, "topic: "+demo.Topic, "topic: "+rs.topic)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	config := write("projections.yaml", string(demo.Projections))
	rs.config = config
	rs.newFile = write("rebuilt.yaml", rebuiltProjections)
	rs.args = append([]string{"run",
		"--brokers", cluster.Brokers(),
		"--registry-url", reg.URL,
		"--database-url", rs.db.URL,
		"--identity", rs.identity,
		"--config", config,
		"--http-addr", "",
		"--log-level", "info",
		"--session-timeout", "6s",
		"--rebuild-check-every", "200ms",
	}, extra...)
	return rs
}

func (rs *rebuildStream) produce(t *testing.T, recs []demo.Record) {
	t.Helper()
	if err := demo.Produce(t.Context(), rs.prod, rs.enc, recs, nil); err != nil {
		t.Fatal(err)
	}
}

// caughtUp waits until identity has stored every partition's log end.
func (rs *rebuildStream) caughtUp(t *testing.T, identity string, children ...*child) {
	t.Helper()
	end, err := demo.EndOffsets(t.Context(), rs.adm, rs.topic)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, func() error {
		for _, c := range children {
			select {
			case err := <-c.done:
				c.done <- err
				t.Fatalf("projector exited: %v\n%s", err, c.stderr)
			default:
			}
		}
		_, done, err := demo.Committed(t.Context(), rs.db.Pool, identity, rs.topic, end)
		if err != nil {
			return err
		}
		if !done {
			return fmt.Errorf("%s has not committed up to the log end %v", identity, end)
		}
		return nil
	})
}

func (rs *rebuildStream) waitOperation(t *testing.T, id string, timeout time.Duration, want string, children ...*child) rebuild.Operation {
	t.Helper()
	store := rebuild.NewStore(rs.db.Pool)
	var op rebuild.Operation
	testenv.WaitFor(t, timeout, func() error {
		var err error
		if op, _, err = store.Operation(t.Context(), id); err != nil {
			return err
		}
		if op.State == want {
			return nil
		}
		if op.Done() {
			t.Fatalf("operation ended %s, want %s: %+v", op.State, want, op.Error)
		}
		var logs strings.Builder
		for _, c := range children {
			logs.WriteString(tail(c.stderr.String(), 3000))
		}
		return fmt.Errorf("operation %s is %s (%s), want %s\n%s", id, op.State, op.Waiting, want, logs.String())
	})
	return op
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// readers reads the projection's table throughout a rebuild as plain
// SQL readers do, and records what they saw.
type readers struct {
	errs     atomic.Int64 // errors other than a cached statement's result type changing
	planErrs atomic.Int64 // 0A000: a statement the driver cached, over a changed column list
	empties  atomic.Int64
	regress  atomic.Int64
	reads    atomic.Int64
	mu       sync.Mutex
	firstErr error
	seen     map[string]int64 // highest version seen per key, across readers
	nonEmpty atomic.Bool
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

func startReaders(t *testing.T, url, table string) *readers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &readers{stop: cancel}
	// A pool with pgx's default statement cache, reading SELECT *.
	cached, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// A simple-protocol reader, as psql reads.
	simpleCfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	simpleCfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	simple, err := pgx.ConnectConfig(ctx, simpleCfg)
	if err != nil {
		t.Fatal(err)
	}
	read := func(q func(context.Context, string) (pgx.Rows, error)) {
		defer r.wg.Done()
		// Per reader: another reader's query may have begun earlier and
		// end later, on an older snapshot.
		seen := map[string]int64{}
		for ctx.Err() == nil {
			rows, err := q(ctx, `SELECT * FROM `+table)
			if err != nil {
				r.note(ctx, err)
				continue
			}
			got := map[string]int64{}
			for rows.Next() {
				m, err := rows.Values()
				if err != nil {
					break
				}
				desc := rows.FieldDescriptions()
				var key string
				var version int64
				for i, f := range desc {
					switch f.Name {
					case "account_id":
						key, _ = m[i].(string)
					case "version":
						version, _ = m[i].(int64)
					}
				}
				got[key] = version
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				r.note(ctx, err)
				continue
			}
			r.reads.Add(1)
			if len(got) == 0 {
				if r.nonEmpty.Load() {
					r.empties.Add(1)
				}
				continue
			}
			r.nonEmpty.Store(true)
			for k, v := range got {
				if v < seen[k] {
					r.regress.Add(1)
				} else {
					seen[k] = v
				}
			}
		}
	}
	r.wg.Add(2)
	go read(func(ctx context.Context, sql string) (pgx.Rows, error) { return cached.Query(ctx, sql) })
	go read(func(ctx context.Context, sql string) (pgx.Rows, error) { return simple.Query(ctx, sql) })
	t.Cleanup(func() {
		r.stop()
		r.wg.Wait()
		cached.Close()
		simple.Close(context.Background())
	})
	return r
}

func (r *readers) note(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "0A000" {
		r.planErrs.Add(1)
		return
	}
	if errors.As(err, &pg) && pg.Code == "42P01" && !r.nonEmpty.Load() {
		return // the table does not exist yet
	}
	r.errs.Add(1)
	r.mu.Lock()
	if r.firstErr == nil {
		r.firstErr = err
	}
	r.mu.Unlock()
}

// TestRebuildDuringLiveTraffic rebuilds the demo's projection with a
// column added and its fold changed while two replicas run and a producer
// keeps writing, also to the aggregates being rebuilt, and readers read
// the table throughout: the operation completes, the table (now the view
// of generation 2) equals the reference fold under the new definition,
// the new generation's dead letters and parked events are its own, and
// the readers never saw an error, an empty table or a version going back.
func TestRebuildDuringLiveTraffic(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 1500, 11
	rs := newRebuildStream(t, opts, 4)
	half := len(rs.records) * 3 / 5
	rs.produce(t, rs.records[:half])
	a := startChild(t, rs.args...)
	b := startChild(t, rs.args...)
	rs.caughtUp(t, rs.identity, a, b)
	rd := startReaders(t, rs.db.URL, demo.Table)

	def := definitionOf(t, rs.newFile, "accounts")
	store := rebuild.NewStore(rs.db.Pool)
	op, err := store.Start(ctx, rebuild.Request{Identity: rs.identity, Projection: "accounts", Definition: &def, Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if op.State != rebuild.StateAccepted || op.Generation != 2 {
		t.Fatalf("started: %+v, want accepted generation 2", op)
	}
	// Live traffic throughout the rebuild.
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		rest := rs.records[half:]
		for len(rest) > 0 && ctx.Err() == nil {
			n := min(len(rest), 200)
			if err := demo.Produce(ctx, rs.prod, rs.enc, rest[:n], nil); err != nil {
				t.Error(err)
				return
			}
			rest = rest[n:]
			time.Sleep(20 * time.Millisecond) // a steady trickle, not a test wait
		}
	}()
	op = rs.waitOperation(t, op.ID, 3*time.Minute, rebuild.StateCompleted, a, b)
	<-produced
	group := rebuild.GroupID(rs.identity, "accounts", 2)
	rs.caughtUp(t, group, a, b)
	rs.groupCaughtUp(t, group)
	rd.stop()
	rd.wg.Wait()

	exp := demo.Fold(rs.records)
	if err := verifyDeposits(ctx, rs.db.Pool, demo.Table, exp); err != nil {
		t.Errorf("the rebuilt projection: %v", err)
	}
	var kind string
	if err := rs.db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass('accounts')`).Scan(&kind); err != nil || kind != "v" {
		t.Errorf("accounts: relkind %q (%v), want a view of the live generation", kind, err)
	}
	var retired bool
	if err := rs.db.Pool.QueryRow(ctx, `SELECT to_regclass('accounts__g1_retired') IS NOT NULL`).Scan(&retired); err != nil || !retired {
		t.Errorf("generation 1's table is not kept as accounts__g1_retired (%v)", err)
	}
	var dead, parked int
	if err := rs.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_dead_letters WHERE identity = $1),
		(SELECT count(*) FROM projector_parked WHERE identity = $1)`, group).Scan(&dead, &parked); err != nil {
		t.Fatal(err)
	}
	if dead != exp.Poison || parked != exp.Parked {
		t.Errorf("generation 2 holds %d dead letters and %d parked events, want %d and %d: its own, each once", dead, parked, exp.Poison, exp.Parked)
	}
	t.Logf("readers: %d reads, %d cached-plan errors, %d other errors", rd.reads.Load(), rd.planErrs.Load(), rd.errs.Load())
	if rd.errs.Load() > 0 || rd.empties.Load() > 0 || rd.regress.Load() > 0 {
		t.Errorf("readers saw %d errors (first: %v), %d empty results, %d versions going back", rd.errs.Load(), rd.firstErr, rd.empties.Load(), rd.regress.Load())
	}
	// pgx's cached SELECT * fails once per connection that prepared it
	// when the column list changes; a pool has at most 4 on 2 cores.
	if n := rd.planErrs.Load(); n > 4 {
		t.Errorf("the cached-statement reader failed %d times, want at most once per connection", n)
	}
	for _, c := range []*child{a, b} {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-c.done; err != nil {
			t.Errorf("projector did not stop cleanly: %v\n%s", err, tail(c.stderr.String(), 4000))
		}
		c.done <- nil
	}
}

// groupCaughtUp waits until the Kafka consumer group of an identity
// holds the log end of every partition, which its members commit to it
// once they have stored it: Kafka's tools then see the group's lag as 0.
func (rs *rebuildStream) groupCaughtUp(t *testing.T, group string) {
	t.Helper()
	end, err := demo.EndOffsets(t.Context(), rs.adm, rs.topic)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() error {
		res, err := rs.adm.FetchOffsets(t.Context(), group)
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			return err
		}
		for p, e := range end {
			if o, ok := res.Lookup(rs.topic, p); !ok || o.At != e {
				return fmt.Errorf("group %s: partition %d committed at %d, want the log end %d", group, p, o.At, e)
			}
		}
		return nil
	})
}

func definitionOf(t *testing.T, path, name string) projection.Definition {
	t.Helper()
	ps, err := projection.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Name == name {
			d, err := p.Definition()
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("%s has no projection %s", path, name)
	return projection.Definition{}
}

// verifyDeposits compares table with the reference fold under the
// rebuilt definition: the demo's columns, and deposits counted.
func verifyDeposits(ctx context.Context, pool *pgxpool.Pool, table string, exp demo.Expected) error {
	if err := demo.Verify(ctx, pool, table, exp); err != nil {
		return err
	}
	rows, err := pool.Query(ctx, `SELECT account_id, deposits FROM `+table)
	if err != nil {
		return err
	}
	var diffs []string
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		if want := exp.Accounts[id].Deposits; n != want && len(diffs) < 10 {
			diffs = append(diffs, fmt.Sprintf("%s: %d deposits, want %d", id, n, want))
		}
		return nil
	}); err != nil {
		return err
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "\n"))
	}
	return nil
}
