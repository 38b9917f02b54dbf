package readapi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks/postgres"
)

// gated holds each statement that reads the rows of "items" until the
// test releases it, and records how many keys each asked for.
type gated struct {
	Querier
	mu    sync.Mutex
	stmts []*gatedStmt // in the order they started
	open  bool         // statements run without being held
}

type gatedStmt struct {
	keys     int
	release  chan struct{}
	released bool
}

func (g *gated) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, `"items"`) {
		st := &gatedStmt{keys: 1, release: make(chan struct{})}
		if keys, ok := args[0].([]string); ok {
			st.keys = len(keys)
		}
		g.mu.Lock()
		g.stmts = append(g.stmts, st)
		if g.open {
			g.releaseLocked(st)
		}
		g.mu.Unlock()
		select {
		case <-st.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Querier.Query(ctx, sql, args...)
}

func (g *gated) releaseLocked(st *gatedStmt) {
	if !st.released {
		st.released = true
		close(st.release)
	}
}

// release lets statement i (from 0) run.
func (g *gated) release(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked(g.stmts[i])
}

// openAll lets every statement run, held or to come.
func (g *gated) openAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = true
	for _, st := range g.stmts {
		g.releaseLocked(st)
	}
}

// keys is how many keys each statement asked for, in order.
func (g *gated) keys() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]int, len(g.stmts))
	for i, st := range g.stmts {
		out[i] = st.keys
	}
	return out
}

// Reads by key, on a pool of two connections: while no more than two
// are under way, each runs a statement of its own at once. Beyond that,
// those that arrive while a statement runs wait for it and go together in
// the next; once parallelAfter wait, and fewer statements run than the
// pool has connections, one more starts with all of them. Each read gets
// its own row.
func TestReadsByKeyGoTogether(t *testing.T) {
	db := testenv.NewDB(t)
	ps, err := projection.Parse([]byte(`projections:
  - name: items
    topic: items
    table: items
    key: id
    mode: snapshot
    columns:
      id: {type: text, primary_key: true}
      n: {type: bigint}
`), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(t.Context(), db.Pool, ps...); err != nil {
		t.Fatal(err)
	}
	const reads = parallelAfter + 6
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO items (id, n, version) SELECT 'k' || i, i, 1 FROM generate_series(1, $1) i`, reads); err != nil {
		t.Fatal(err)
	}
	g := &gated{Querier: db.Pool}
	a, err := New(Config{Projections: ps, DB: g, Authenticator: auth.None{}})
	if err != nil {
		t.Fatal(err)
	}
	v := a.views["items"]
	v.batches.limit = 2 // a pool of two
	tbl, err := v.columns(t.Context(), g)
	if err != nil {
		t.Fatal(err)
	}
	queue := func() (running, pending int) {
		v.batches.mu.Lock()
		defer v.batches.mu.Unlock()
		if q := v.batches.queues[""]; q != nil {
			return q.running, len(q.pending)
		}
		return 0, 0
	}
	var wg sync.WaitGroup
	defer wg.Wait() // after openAll below: no read outlives the test
	done := make([]chan struct{}, reads+1)
	read := func(i int) {
		done[i] = make(chan struct{})
		wg.Go(func() {
			defer close(done[i])
			row, err := a.getByKey(context.Background(), v, tbl, fmt.Sprintf("k%d", i), "")
			if want := fmt.Sprintf(`"n":%d`, i); err != nil || row == nil || !strings.Contains(string(row.json), want) {
				t.Errorf("k%d: row %v, err %v; want one with %s", i, row, err, want)
			}
		})
	}
	waitFor := func(what string, cond func(running, pending int) bool) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, func() error {
			if running, pending := queue(); !cond(running, pending) {
				return fmt.Errorf("%s: statements of %v keys, %d running, %d reads waiting", what, g.keys(), running, pending)
			}
			return nil
		})
	}
	wantKeys := func(want ...int) {
		t.Helper()
		if got := g.keys(); !slices.Equal(got, want) {
			t.Fatalf("statements of %v keys, want %v", got, want)
		}
	}
	defer g.openAll() // a failed test leaves nothing held

	read(1)
	waitFor("a statement for the first read", func(running, _ int) bool { return running == 1 && len(g.keys()) == 1 })
	read(2)
	waitFor("a statement for each of two reads", func(running, _ int) bool { return running == 2 && len(g.keys()) == 2 })
	for i := 3; i <= 5; i++ {
		read(i)
	}
	waitFor("the reads beyond the pool waiting", func(_, pending int) bool { return pending == 3 })
	wantKeys(1, 1)
	g.release(1)
	<-done[2]
	waitFor("the reads waiting read together", func(running, pending int) bool {
		return running == 2 && pending == 0 && len(g.keys()) == 3
	})
	wantKeys(1, 1, 3)
	g.release(0)
	<-done[1]
	waitFor("one statement running", func(running, _ int) bool { return running == 1 })
	// Four reads are under way, in one statement: those that arrive wait
	// for it, until parallelAfter do.
	for i := 6; i < 6+parallelAfter-1; i++ {
		read(i)
	}
	waitFor("the reads after it waiting", func(_, pending int) bool { return pending == parallelAfter-1 })
	wantKeys(1, 1, 3)
	read(6 + parallelAfter - 1)
	waitFor("a statement beside it", func(running, pending int) bool { return running == 2 && pending == 0 && len(g.keys()) == 4 })
	wantKeys(1, 1, 3, parallelAfter)
	// As many statements run as the pool has connections: the next waits.
	read(reads)
	waitFor("the last read waiting", func(_, pending int) bool { return pending == 1 })
	g.openAll()
	wg.Wait()
	wantKeys(1, 1, 3, parallelAfter, 1)
}
