package readapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/readapi"
)

// statement is one statement a request ran: its text, arguments and
// command tag (SELECT 0: no row returned).
type statement struct {
	sql  string
	args []any
	tag  string
}

func (s statement) String() string { return fmt.Sprintf("%s %v → %s", s.sql, s.args, s.tag) }

// statementLog records the statements run on a pool.
type statementLog struct {
	mu    sync.Mutex
	stmts []statement
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = append(l.stmts, statement{sql: d.SQL, args: d.Args})
	return ctx
}

func (l *statementLog) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.stmts); n > 0 {
		l.stmts[n-1].tag = d.CommandTag.String()
		if d.Err != nil {
			l.stmts[n-1].tag = "error: " + d.Err.Error()
		}
	}
}

// take returns the statements run since the last take. The watcher's
// look for rebuilt projections' table, run at most every 10 seconds for
// every wait alike, is left out: when it falls is a matter of time.
func (l *statementLog) take() []statement {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.DeleteFunc(l.stmts, func(s statement) bool { return strings.Contains(s.sql, "'projector_generations'") })
	l.stmts = nil
	return out
}

// tenantKey is the key whose row the tests of tenants move between
// states; the table holds others of the same length around it.
const tenantKey = "k000501"

// tenantStates are what tenantKey's aggregate may be, as the statements
// that put it there: the row of the reader's tenant (acme), another
// tenant's row, no row at all, and a deleted aggregate (its tombstone).
var tenantStates = map[string]string{
	"own": `DELETE FROM projector_tombstones WHERE key = '` + tenantKey + `';
		INSERT INTO orders (id, org, status, amount, version) VALUES ('` + tenantKey + `', 'acme', 'open', 1, 5)
		ON CONFLICT (id) DO UPDATE SET org = excluded.org, version = excluded.version`,
	"other": `DELETE FROM projector_tombstones WHERE key = '` + tenantKey + `';
		INSERT INTO orders (id, org, status, amount, version) VALUES ('` + tenantKey + `', 'globex', 'open', 1, 5)
		ON CONFLICT (id) DO UPDATE SET org = excluded.org, version = excluded.version`,
	"missing": `DELETE FROM projector_tombstones WHERE key = '` + tenantKey + `';
		DELETE FROM orders WHERE id = '` + tenantKey + `'`,
	"deleted": `DELETE FROM orders WHERE id = '` + tenantKey + `';
		INSERT INTO projector_tombstones (table_name, key, version) VALUES ('orders', '` + tenantKey + `', 7)
		ON CONFLICT DO NOTHING`,
}

// answer is what a client and the database see of one request.
type answer struct {
	status int
	header http.Header // Date left out
	body   []byte
	took   time.Duration
	stmts  []statement
	plans  []string // each statement's plan, rows and buffers
}

// TestAnotherTenantsRowIsAMissingOne: to a reader bound to a tenant,
// another tenant's row and a deleted aggregate answer as a key no row
// has, byte for byte, for a read, a HEAD, a conditional read and reads
// that wait for a version (a version the other tenant's row has reached
// included): the same status, headers and body, after the same time
// (each wait runs out), and the database does the same work: the same
// statements, each the same index probe reading the same pages and
// returning no row.
func TestAnotherTenantsRowIsAMissingOne(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	// Rows of both tenants around the key, so that its probes descend
	// indexes as a table's would, with the planner's statistics: 100,000
	// rows, whose primary key index is a level shallower than the index
	// on the tenant and key columns, which makes PostgreSQL probe the
	// primary key for a plain condition on both columns.
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version)
		SELECT 'k' || lpad(i::text, 6, '0'), CASE WHEN i % 2 = 0 THEN 'acme' ELSE 'globex' END, 'open', i, 1
		FROM generate_series(1, 100000) i WHERE i <> 501`)
	vacuumed(t, b)

	// The API and its watcher on a pool of one connection that records
	// their statements. The watcher does not run: each wait runs out and
	// reads the key once at its end, so that the statements of a wait are
	// known.
	pc, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	log := &statementLog{}
	pc.ConnConfig.Tracer = log
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	srv := tenantServer(t, b, pool, false)

	const wait = 200 * time.Millisecond
	type ask struct {
		name, method, path string
		header             []string
		wait               time.Duration
	}
	row := "/v1/projections/orders/rows/" + tenantKey
	asks := []ask{
		{name: "read", method: http.MethodGet, path: row},
		{name: "HEAD", method: http.MethodHead, path: row},
		{name: "If-None-Match", method: http.MethodGet, path: row, header: []string{"If-None-Match", `"5"`}},
		{name: "min_version", method: http.MethodGet, path: row + "?min_version=5&wait=200ms", wait: wait},
		{name: "min_version stale=ok", method: http.MethodGet, path: row + "?min_version=5&wait=200ms&stale=ok", wait: wait},
		{name: "Projector-Min-Version wait=0", method: http.MethodGet, path: row + "?wait=0", header: []string{"Projector-Min-Version", "1"}},
	}
	do := func(a ask) answer {
		t.Helper()
		log.take()
		req, err := http.NewRequestWithContext(t.Context(), a.method, srv.URL+a.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer acme")
		for i := 0; i+1 < len(a.header); i += 2 {
			req.Header.Set(a.header[i], a.header[i+1])
		}
		began := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(began)
		if err != nil {
			t.Fatal(err)
		}
		resp.Header.Del("Date")
		got := answer{status: resp.StatusCode, header: resp.Header, body: body, took: took, stmts: log.take()}
		for _, s := range got.stmts {
			got.plans = append(got.plans, explain(t, b, s))
		}
		return got
	}
	// The columns and the key column's type are read once, by the first
	// requests.
	for _, a := range asks {
		do(a)
	}

	// Reads that arrive together are read in one statement: the key
	// beside one of the reader's own rows.
	ps, err := projection.Parse([]byte(ordersYAML), ".")
	if err != nil {
		t.Fatal(err)
	}
	_, batchedSQL, err := readapi.TenantReads(t.Context(), b.db.Pool, ps[0])
	if err != nil || batchedSQL == "" {
		t.Fatalf("the batched read's statement: %q, %v", batchedSQL, err)
	}
	batched := statement{sql: batchedSQL, args: []any{[]string{tenantKey, "k000002"}, "acme"}}

	answers := map[string]map[string]answer{}
	batchPlans := map[string]string{}
	for _, state := range []string{"missing", "other", "deleted", "own"} {
		b.exec(t, tenantStates[state])
		answers[state] = map[string]answer{}
		for _, a := range asks {
			answers[state][a.name] = do(a)
		}
		batchPlans[state] = explain(t, b, batched)
	}
	for _, state := range []string{"other", "deleted"} {
		if batchPlans[state] != batchPlans["missing"] {
			t.Errorf("a batched read of the %s row: plan %q; of a missing key %q", state, batchPlans[state], batchPlans["missing"])
		}
	}
	if batchPlans["own"] == batchPlans["missing"] {
		t.Errorf("a batched read of the reader's own row: plan %q, a missing key's: the plans compared tell nothing", batchPlans["own"])
	}
	for _, a := range asks {
		want := answers["missing"][a.name]
		if want.status != http.StatusNotFound && want.status != http.StatusPreconditionFailed {
			t.Errorf("%s of a missing key: status %d, want 404 or 412: %s", a.name, want.status, want.body)
		}
		if len(want.stmts) == 0 {
			t.Errorf("%s of a missing key: no statement recorded", a.name)
		}
		for _, state := range []string{"other", "deleted"} {
			got := answers[state][a.name]
			if got.status != want.status || !bytes.Equal(got.body, want.body) {
				t.Errorf("%s of the %s row: %d %q; of a missing key: %d %q", a.name, state, got.status, got.body, want.status, want.body)
			}
			if !headersEqual(got.header, want.header) {
				t.Errorf("%s of the %s row: headers %v; of a missing key: %v", a.name, state, got.header, want.header)
			}
			if !slices.EqualFunc(got.stmts, want.stmts, func(x, y statement) bool { return x.String() == y.String() }) {
				t.Errorf("%s of the %s row ran %v; of a missing key %v", a.name, state, got.stmts, want.stmts)
			}
			if !slices.Equal(got.plans, want.plans) {
				t.Errorf("%s of the %s row: plans %q; of a missing key %q", a.name, state, got.plans, want.plans)
			}
		}
		for _, state := range []string{"missing", "other", "deleted"} {
			if got := answers[state][a.name]; got.took < a.wait {
				t.Errorf("%s of the %s row answered after %v, before its wait of %v ran out", a.name, state, got.took, a.wait)
			}
		}
	}
	// The comparison sees a row: the reader's own one answers otherwise,
	// and its probe returns it.
	own, missing := answers["own"]["read"], answers["missing"]["read"]
	if own.status != http.StatusOK {
		t.Errorf("the reader's own row: status %d: %s", own.status, own.body)
	}
	if slices.Equal(own.plans, missing.plans) {
		t.Errorf("the reader's own row's plan %q is a missing key's: the plans compared tell nothing", own.plans)
	}
}

// TestWaitForAnotherTenantsRowRunsOut: with the watcher running, as
// serve runs it, a wait bound to a tenant for a version another
// tenant's row has reached runs out as one for a key no row has, and
// answers the same.
func TestWaitForAnotherTenantsRowRunsOut(t *testing.T) {
	b := setup(t, ordersYAML, readapi.Config{})
	srv := tenantServer(t, b, b.db.Pool, true)
	const wait = 300 * time.Millisecond
	ask := func(waitParam string) (int, []byte, time.Duration) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/projections/orders/rows/"+tenantKey+"?min_version=5&wait="+waitParam, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer acme")
		began := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body, time.Since(began)
	}
	b.exec(t, tenantStates["other"])
	otherStatus, otherBody, otherTook := ask("300ms")
	b.exec(t, tenantStates["missing"])
	missingStatus, missingBody, missingTook := ask("300ms")
	if otherStatus != http.StatusPreconditionFailed || otherStatus != missingStatus || !bytes.Equal(otherBody, missingBody) {
		t.Errorf("another tenant's row: %d %s; a missing key: %d %s; want the same 412", otherStatus, otherBody, missingStatus, missingBody)
	}
	if otherTook < wait || missingTook < wait {
		t.Errorf("another tenant's row answered after %v, a missing key after %v: both wait %v", otherTook, missingTook, wait)
	}
	// A wait of the row's own tenant ends once a round reads the row,
	// long before its time.
	b.exec(t, tenantStates["own"])
	if status, body, took := ask("30s"); status != http.StatusOK || took >= 15*time.Second {
		t.Errorf("the reader's own row: %d after %v, want 200 before the wait ran out: %s", status, took, body)
	}
}

// tenantServer serves the API of b's projections on pool with a
// watcher of versions and staleness, run or not.
func tenantServer(t testing.TB, b *bundle, pool *pgxpool.Pool, run bool) *httptest.Server {
	t.Helper()
	ps, err := projection.Parse([]byte(ordersYAML), ".")
	if err != nil {
		t.Fatal(err)
	}
	w, err := freshness.NewWatcher(pool, ps, freshness.Config{Identity: "group",
		TenantColumns: map[string]string{"orders": "org"}, StalenessCache: -1})
	if err != nil {
		t.Fatal(err)
	}
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("watcher: %v", err)
			}
		})
	}
	api, err := readapi.New(readapi.Config{Projections: ps, DB: pool, Authenticator: testTokens,
		Staleness: w, Waiter: readapi.WatcherWaiter(w)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return srv
}

// vacuumed vacuums and analyzes the orders table until its visibility
// map marks most of its pages all-visible, as autovacuum leaves a table
// that is not written everywhere at once: a vacuum marks none while a
// transaction older than the table's rows runs anywhere in the
// database, which other tests' do.
func vacuumed(t testing.TB, b *bundle) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, func() error {
		var pages, visible int64
		if _, err := b.db.Pool.Exec(t.Context(), `VACUUM ANALYZE orders`); err != nil {
			return err
		}
		if err := b.db.Pool.QueryRow(t.Context(), `SELECT relpages, relallvisible FROM pg_class WHERE oid = 'orders'::regclass`).Scan(&pages, &visible); err != nil {
			return err
		}
		if visible*10 < pages*9 {
			return fmt.Errorf("vacuum marked %d of %d pages of orders all-visible", visible, pages)
		}
		return nil
	})
}

// explain is the plan of s in b's database as it stands, planned for
// its arguments and planned generically, as a prepared statement is
// after a few runs: each node's type, index, rows and pages read, which
// tell whether two statements did the same work.
func explain(t testing.TB, b *bundle, s statement) string {
	t.Helper()
	ctx := t.Context()
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "PREPARE projector_explained AS "+s.sql); err != nil {
		t.Fatalf("prepare %s: %v", s, err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "DEALLOCATE projector_explained; RESET plan_cache_mode") //nolint:errcheck // the test's own connection
	args := make([]string, len(s.args))
	for i, a := range s.args {
		switch a := a.(type) {
		case string:
			args[i] = literal(a)
		case []string:
			quoted := make([]string, len(a))
			for j, v := range a {
				quoted[j] = literal(v)
			}
			args[i] = "ARRAY[" + strings.Join(quoted, ", ") + "]::text[]"
		default:
			t.Fatalf("explain %s: an argument of type %T", s, a)
		}
	}
	type node struct {
		Type     string `json:"Node Type"`
		Relation string `json:"Parent Relationship"`
		Index    string `json:"Index Name"`
		Cond     string `json:"Index Cond"`
		Filter   string `json:"Filter"`
		Rows     int64  `json:"Actual Rows"`
		Loops    int64  `json:"Actual Loops"`
		Hit      int64  `json:"Shared Hit Blocks"`
		Read     int64  `json:"Shared Read Blocks"`
		Fetches  int64  `json:"Heap Fetches"`
		Removed  int64  `json:"Rows Removed by Filter"`
		Plans    []node `json:"Plans"`
	}
	var out strings.Builder
	var walk func(n node, depth int)
	walk = func(n node, depth int) {
		fmt.Fprintf(&out, "%s%s %s %s [%s] filter [%s] rows=%d loops=%d removed=%d heap-fetches=%d pages=%d; ",
			strings.Repeat(" ", depth), n.Relation, n.Type, n.Index, n.Cond, n.Filter, n.Rows, n.Loops, n.Removed, n.Fetches, n.Hit+n.Read)
		for _, c := range n.Plans {
			walk(c, depth+1)
		}
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		var raw []byte
		err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) EXECUTE projector_explained("+strings.Join(args, ", ")+")").Scan(&raw)
		if err != nil {
			t.Fatalf("explain %s: %v", s, err)
		}
		var plans []struct{ Plan node }
		if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
			t.Fatalf("explain %s: %s: %v", s, raw, err)
		}
		fmt.Fprintf(&out, "%s: ", mode)
		walk(plans[0].Plan, 0)
	}
	return out.String()
}

// literal is s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// headersEqual compares two answers' headers.
func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// BenchmarkTenantTiming measures, over loopback HTTP, a reader bound to
// a tenant asking for another tenant's keys and for keys no row has,
// alternately (a pair per iteration, in a random order), one request
// at a time, after a warm-up, against a projection of 100,000 rows of
// two tenants whose missing keys lie between theirs. It reports each
// kind's median and 90th percentile, their differences (other less
// missing), and the noise they are to be read against: the larger
// difference between two interleaved halves of the same kind's samples.
// A difference within the noise in one run may still be a bias: read
// its sign over several runs (-count).
//
//   - get: GET /v1/projections/orders/rows/{key};
//   - min_version: the same with ?min_version=1&wait=0, whose wait
//     ends at once and reads the key, with the watcher running.
func BenchmarkTenantTiming(b *testing.B) {
	bb := setup(b, ordersYAML, readapi.Config{})
	const candidates = 150_000 // a third acme's, a third globex's, a third missing
	if _, err := bb.db.Pool.Exec(b.Context(), `INSERT INTO orders (id, org, status, amount, version)
		SELECT 'k' || lpad(i::text, 6, '0'), CASE WHEN i % 3 = 0 THEN 'acme' ELSE 'globex' END, 'open', i, 1
		FROM generate_series(1, $1) i WHERE i % 3 <> 2`, candidates); err != nil {
		b.Fatal(err)
	}
	vacuumed(b, bb)
	// The pool records the first tenant-bound read, whose plans the
	// benchmark logs: the figures hold for the plans they were taken with.
	pc, err := pgxpool.ParseConfig(bb.db.URL)
	if err != nil {
		b.Fatal(err)
	}
	first := &firstTenantRead{}
	pc.ConnConfig.Tracer = first
	pool, err := pgxpool.NewWithConfig(b.Context(), pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	srv := tenantServer(b, bb, pool, true)
	addr := strings.TrimPrefix(srv.URL, "http://")

	for _, c := range []struct{ name, query string }{
		{"get", ""},
		{"min_version", "?min_version=1&wait=0"},
	} {
		b.Run(c.name, func(b *testing.B) {
			conn, err := dialRaw(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.close()
			rng := rand.New(rand.NewPCG(1, 2))
			key := func(rest int) string { return fmt.Sprintf("k%06d", rng.IntN(candidates/3)*3+rest) }
			var other, missing []time.Duration
			pair := func(record bool) {
				kinds := [2]int{1, 2} // i % 3: 1 another tenant's, 2 missing
				if rng.IntN(2) == 0 {
					kinds[0], kinds[1] = kinds[1], kinds[0]
				}
				for _, kind := range kinds {
					path := "/v1/projections/orders/rows/" + key(kind) + c.query
					began := time.Now()
					if err := conn.ask(path, "Authorization: Bearer acme\r\n", "404", "412"); err != nil {
						b.Fatal(err)
					}
					took := time.Since(began)
					switch {
					case !record:
					case kind == 1:
						other = append(other, took)
					default:
						missing = append(missing, took)
					}
				}
			}
			for range 1000 {
				pair(false)
			}
			b.ResetTimer()
			for range b.N {
				pair(true)
			}
			b.StopTimer()
			o50, o90 := quantile(other, 0.5), quantile(other, 0.9)
			m50, m90 := quantile(missing, 0.5), quantile(missing, 0.9)
			noise50, noise90 := max(halves(other, 0.5), halves(missing, 0.5)), max(halves(other, 0.9), halves(missing, 0.9))
			b.ReportMetric(o50, "other-p50-µs")
			b.ReportMetric(m50, "missing-p50-µs")
			b.ReportMetric(o50-m50, "diff-p50-µs")
			b.ReportMetric(noise50, "noise-p50-µs")
			b.ReportMetric(o90, "other-p90-µs")
			b.ReportMetric(m90, "missing-p90-µs")
			b.ReportMetric(o90-m90, "diff-p90-µs")
			b.ReportMetric(noise90, "noise-p90-µs")
		})
	}
	if s := first.s.Load(); s != nil {
		b.Logf("plans of the read of another tenant's key: %s", explain(b, bb, *s))
	}
}

// firstTenantRead records the first tenant-bound read by key.
type firstTenantRead struct{ s atomic.Pointer[statement] }

func (f *firstTenantRead) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if f.s.Load() == nil && strings.Contains(d.SQL, "projector_probe") && !strings.Contains(d.SQL, "unnest") {
		f.s.CompareAndSwap(nil, &statement{sql: d.SQL, args: d.Args})
	}
	return ctx
}

func (f *firstTenantRead) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// quantile is the q quantile of samples, in microseconds.
func quantile(samples []time.Duration, q float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1000
}

// halves is how far apart the q quantiles of two halves of samples
// are, in microseconds: the even and the odd ones, interleaved in time
// as the two kinds are, so that the figure is the noise a difference
// between the kinds is read against, which a drift of the machine's load
// during the run does not swell.
func halves(samples []time.Duration, q float64) float64 {
	var even, odd []time.Duration
	for i, d := range samples {
		if i%2 == 0 {
			even = append(even, d)
		} else {
			odd = append(odd, d)
		}
	}
	return math.Abs(quantile(even, q) - quantile(odd, q))
}
