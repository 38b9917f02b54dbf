package readapi

import (
	"context"
	"fmt"
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

// gated holds each statement that reads the rows of "items" until
// release is closed, and records how many keys each asked for.
type gated struct {
	Querier
	release chan struct{}
	mu      sync.Mutex
	keys    []int // per statement, in the order they started
}

func (g *gated) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, `"items"`) {
		n := 1
		if keys, ok := args[0].([]string); ok {
			n = len(keys)
		}
		g.mu.Lock()
		g.keys = append(g.keys, n)
		g.mu.Unlock()
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Querier.Query(ctx, sql, args...)
}

func (g *gated) statements() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.keys...)
}

// A read by key runs at once when no statement of its projection runs;
// those that arrive while one runs wait for it, in one statement after
// it, unless parallelAfter wait: then one more starts beside it with all
// of them. Each read gets its own row.
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
	const reads = parallelAfter + 4
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO items (id, n, version) SELECT 'k' || i, i, 1 FROM generate_series(1, $1) i`, reads); err != nil {
		t.Fatal(err)
	}
	g := &gated{Querier: db.Pool, release: make(chan struct{})}
	a, err := New(Config{Projections: ps, DB: g, Authenticator: auth.None{}})
	if err != nil {
		t.Fatal(err)
	}
	v := a.views["items"]
	tbl, err := v.columns(t.Context(), g)
	if err != nil {
		t.Fatal(err)
	}
	pending := func() int {
		v.batches.mu.Lock()
		defer v.batches.mu.Unlock()
		if q := v.batches.queues[""]; q != nil {
			return len(q.pending)
		}
		return 0
	}
	var wg sync.WaitGroup
	read := func(i int) {
		wg.Go(func() {
			row, err := a.getByKey(context.Background(), v, tbl, fmt.Sprintf("k%d", i), "")
			if want := fmt.Sprintf(`"n":%d`, i); err != nil || row == nil || !strings.Contains(string(row.json), want) {
				t.Errorf("k%d: row %v, err %v; want one with %s", i, row, err, want)
			}
		})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, func() error {
			if !cond() {
				return fmt.Errorf("%s: statements %v, %d reads waiting", what, g.statements(), pending())
			}
			return nil
		})
	}

	read(1)
	waitFor("the first read's statement", func() bool { return len(g.statements()) == 1 })
	for i := 2; i <= parallelAfter; i++ {
		read(i)
	}
	waitFor("the reads after it waiting", func() bool { return pending() == parallelAfter-1 })
	if s := g.statements(); len(s) != 1 {
		t.Fatalf("statements %v while one ran, want the others waiting for it", s)
	}
	read(parallelAfter + 1)
	waitFor("a statement of the reads waiting", func() bool { return len(g.statements()) == 2 })
	if s := g.statements(); s[1] != parallelAfter {
		t.Fatalf("statements %v, want the second of %d keys: those waiting and the one that started it", s, parallelAfter)
	}
	for i := parallelAfter + 2; i <= reads; i++ {
		read(i)
	}
	waitFor("the last reads waiting", func() bool { return pending() == reads-parallelAfter-1 })
	close(g.release)
	wg.Wait()
	total := 0
	for _, n := range g.statements() {
		total += n
	}
	if total != reads {
		t.Errorf("statements %v read %d keys, want each of the %d once", g.statements(), total, reads)
	}
}
