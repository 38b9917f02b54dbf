package rebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks/postgres"
)

const itemsFile = `
projections:
  - name: items
    topic: items.events
    table: items
    key: id
    mode: snapshot
    columns:
      id:    {type: text, primary_key: true}
      label: {type: text}
`

// itemsWithColor adds a column.
var itemsWithColor = strings.Replace(itemsFile, "      label: {type: text}\n", "      label: {type: text}\n      color: {type: text}\n", 1)

func parse(t *testing.T, file string) *projection.Projection {
	t.Helper()
	ps, err := projection.Parse([]byte(file), "")
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

// cutoverSetup is a projection at generation 1 with rows, and a rebuild
// of it cutting over with generation 2 filled as far.
type cutoverSetup struct {
	db         *testenv.DB
	store      *Store
	op         Operation
	live, next *Generation
}

func newCutover(t *testing.T, rows int) *cutoverSetup {
	t.Helper()
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	p := parse(t, itemsFile)
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		t.Fatal(err)
	}
	store := NewStore(db.Pool)
	if _, err := store.Ensure(ctx, "app", []*projection.Projection{p}); err != nil {
		t.Fatal(err)
	}
	def, err := parse(t, itemsWithColor).Definition()
	if err != nil {
		t.Fatal(err)
	}
	op, err := store.Start(ctx, Request{Identity: "app", Projection: "items", Definition: &def})
	if err != nil {
		t.Fatal(err)
	}
	next := parse(t, itemsWithColor)
	next.Table = "items__g2"
	if err := postgres.Migrate(ctx, db.Pool, next); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO items SELECT 'k' || i, 'old', 1 FROM generate_series(1, $1) i`,
		`INSERT INTO items__g2 SELECT 'k' || i, 'new', 'red', 1 FROM generate_series(1, $1) i`,
		`INSERT INTO projector_offsets (identity, topic, partition, next_offset, owner_epoch) VALUES ('app', 'items.events', 0, $1, 1), ('app.items.g2', 'items.events', 0, $1, 1)`,
		`UPDATE projector_rebuilds SET state = 'cutting_over' WHERE $1 > 0`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt, rows); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	op.State = StateCuttingOver
	gs, err := store.Generations(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	return &cutoverSetup{db: db, store: store, op: op, live: &gs[0], next: &gs[1]}
}

// TestCutoverDoesNotQueueReadersBehindALongReader holds the projection's
// table in a 30-second read while other readers read it in a loop and
// the cutover tries again and again: each try gives up within the lock
// timeout and says who holds the lock, the other readers never wait for
// long, and once the long reader ends the cutover makes generation 2 live.
func TestCutoverDoesNotQueueReadersBehindALongReader(t *testing.T) {
	ctx := t.Context()
	c := newCutover(t, 100)

	long, err := c.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := long.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 100 {
		t.Fatalf("long reader: %d rows, %v", n, err)
	}
	longUntil := time.Now().Add(30 * time.Second)

	var (
		slowest  atomic.Int64
		readErrs atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				var rows int
				if err := c.db.Pool.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&rows); err != nil || rows != 100 {
					readErrs.Add(1)
				}
				if d := time.Since(start); d.Nanoseconds() > slowest.Load() {
					slowest.Store(d.Nanoseconds())
				}
			}
		})
	}

	var timeouts int
	var why string
	for time.Now().Before(longUntil) {
		err := c.store.cutover(ctx, c.op, "items.events", c.live, c.next, 100*time.Millisecond, time.Second, time.Hour)
		if !errors.Is(err, errLockTimeout) {
			t.Fatalf("cutover while a reader holds the table: %v, want a lock timeout", err)
		}
		timeouts++
		why = c.store.holder(ctx, "items")
		time.Sleep(500 * time.Millisecond) // the supervisor's pace between tries
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.store.cutover(ctx, c.op, "items.events", c.live, c.next, 100*time.Millisecond, time.Second, time.Hour); err != nil {
		t.Fatalf("cutover once the long reader ended: %v", err)
	}
	close(stop)
	wg.Wait()

	if !strings.Contains(why, "pid ") || !strings.Contains(why, "items") {
		t.Errorf("the waiting reason does not say who holds the lock: %q", why)
	}
	if d := time.Duration(slowest.Load()); d > 2*time.Second {
		t.Errorf("a reader waited %s behind the cutover; want about its 100ms lock timeout", d)
	}
	if readErrs.Load() > 0 {
		t.Errorf("readers failed %d times", readErrs.Load())
	}
	t.Logf("%d tries timed out; slowest read %s", timeouts, time.Duration(slowest.Load()))

	var label, color string
	if err := c.db.Pool.QueryRow(ctx, `SELECT label, color FROM items WHERE id = 'k1'`).Scan(&label, &color); err != nil || label != "new" || color != "red" {
		t.Errorf("items after the cutover: %q %q (%v), want generation 2's row", label, color, err)
	}
	gs, err := c.store.Generations(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if gs[0].State != Retired || gs[1].State != Live || gs[0].PhysicalTable != "items__g1" || gs[0].GroupID != "app.items.g1" {
		t.Errorf("generations after the cutover: %+v", gs)
	}
	var kept int64
	if err := c.db.Pool.QueryRow(ctx, `SELECT next_offset FROM projector_offsets WHERE identity = 'app.items.g1'`).Scan(&kept); err != nil || kept != 100 {
		t.Errorf("generation 1's own offsets: %d (%v), want 100, where its table stands", kept, err)
	}
	if err := c.db.Pool.QueryRow(ctx, `SELECT count(*) FROM items__g1_retired`).Scan(&n); err != nil || n != 100 {
		t.Errorf("items__g1_retired: %d rows (%v), want generation 1's 100", n, err)
	}
	// Writing through the view is refused with the code engines know.
	_, err = c.db.Pool.Exec(ctx, `UPDATE items SET label = 'x' WHERE id = 'k1'`)
	if err == nil || !strings.Contains(err.Error(), "PJ001") {
		t.Errorf("a write through the view: %v, want SQLSTATE PJ001", err)
	}
	op, _, err := c.store.Operation(ctx, c.op.ID)
	if err != nil || op.State != StateCompleted {
		t.Errorf("operation after the cutover: %s (%v)", op.State, err)
	}
}

// TestCutoverWaitsForTheNewGenerationToReachTheLive refuses to cut over
// while generation 2 has applied fewer records than the live one on a
// partition: readers would see versions go back.
func TestCutoverWaitsForTheNewGenerationToReachTheLive(t *testing.T) {
	ctx := t.Context()
	c := newCutover(t, 10)
	if _, err := c.db.Pool.Exec(ctx, `UPDATE projector_offsets SET next_offset = 7 WHERE identity = 'app.items.g2'`); err != nil {
		t.Fatal(err)
	}
	err := c.store.cutover(ctx, c.op, "items.events", c.live, c.next, 100*time.Millisecond, 200*time.Millisecond, time.Hour)
	var behind *behindError
	if !errors.As(err, &behind) || behind.records != 3 || behind.partition != 0 {
		t.Fatalf("cutover with generation 2 three records behind: %v", err)
	}
	// It catches up while the cutover holds the live generation's
	// commits.
	go func() {
		time.Sleep(100 * time.Millisecond) // within the cutover's wait
		_, _ = c.db.Pool.Exec(context.Background(), `UPDATE projector_offsets SET next_offset = 10 WHERE identity = 'app.items.g2'`)
	}()
	if err := c.store.cutover(ctx, c.op, "items.events", c.live, c.next, 100*time.Millisecond, 5*time.Second, time.Hour); err != nil {
		t.Fatalf("cutover once generation 2 reached the live one: %v", err)
	}
}

// TestCancelRacesTheCutover cancels an operation while it moves to
// cutting over, many times: exactly one of them wins each time.
func TestCancelRacesTheCutover(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	p := parse(t, itemsFile)
	store := NewStore(db.Pool)
	if _, err := store.Ensure(ctx, "app", []*projection.Projection{p}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		op, err := store.Start(ctx, Request{Identity: "app", Projection: "items"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `UPDATE projector_rebuilds SET state = 'running' WHERE id = $1`, op.ID); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var cancelled, cutting bool
		wg.Go(func() {
			_, err := store.Cancel(ctx, op.ID, "test")
			cancelled = err == nil
		})
		wg.Go(func() {
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, `UPDATE projector_rebuilds SET state = 'cutting_over' WHERE id = $1 AND state = 'running'`, op.ID)
				cutting = tag.RowsAffected() == 1
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if cancelled == cutting {
			t.Fatalf("race %d: cancelled %t, cutting over %t: want exactly one winner", i, cancelled, cutting)
		}
		got, _, err := store.Operation(ctx, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: StateCancelled, false: StateCuttingOver}[cancelled]; got.State != want {
			t.Fatalf("race %d: state %s, want %s", i, got.State, want)
		}
		// Clear the way for the next start.
		if _, err := db.Pool.Exec(ctx, `UPDATE projector_rebuilds SET state = 'failed' WHERE id = $1 AND state <> 'cancelled'`, op.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRetiredGenerationDroppedAfterItsRetention drops a retired
// generation once its retention has passed: its table, stored offsets and
// parked events go; the live generation stays.
func TestRetiredGenerationDroppedAfterItsRetention(t *testing.T) {
	ctx := t.Context()
	c := newCutover(t, 10)
	if err := c.store.cutover(ctx, c.op, "items.events", c.live, c.next, time.Second, time.Second, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	s := New(Config{Identity: "app", Store: c.store})
	testenv.WaitFor(t, 10*time.Second, func() error {
		s.cleanup(ctx)
		var table bool
		var offsets int
		if err := c.db.Pool.QueryRow(ctx, `SELECT to_regclass('items__g1_retired') IS NOT NULL,
			(SELECT count(*) FROM projector_offsets WHERE identity = 'app.items.g1')`).Scan(&table, &offsets); err != nil {
			return err
		}
		if table || offsets > 0 {
			return fmt.Errorf("generation 1 past its retention: table kept %t, %d stored offsets", table, offsets)
		}
		return nil
	})
	gs, err := c.store.Generations(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 1 || gs[0].N != 2 || gs[0].State != Live {
		t.Errorf("generations after the drop: %+v, want generation 2 live alone", gs)
	}
	var n int
	if err := c.db.Pool.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 10 {
		t.Errorf("items after the drop: %d rows (%v), want the live generation's 10", n, err)
	}
}
