package bench

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// tracer watches the engine's batch transactions through pgx's tracing
// hooks, without touching engine code: a batch transaction is "begin", a
// pipeline that loads state, a pipeline that writes the changes and moves
// the fenced offset (UPDATE projector_offsets … WHERE owner_epoch = …), and
// "commit". When COMMIT returns, the batch's offsets are visible: that is
// the commit time freshness is measured against.
type tracer struct {
	log bool // keep every commit (freshness)

	conns sync.Map // *pgx.Conn → *txTrace

	mu        sync.Mutex
	committed map[int32]int64 // next offset per partition after the last commit
	lastAt    time.Time
	commits   []Commit
	rowWrites int64
	phases    Phases
	notify    chan struct{}
}

type txTrace struct {
	beginStart, beginEnd time.Time
	loadStart, loadEnd   time.Time
	writeStart, writeEnd time.Time
	commitStart          time.Time
	advance              *Commit
	rows                 int64
}

type ctxKey int

const (
	keyQuery ctxKey = iota
	keyBatch
)

func newTracer(keepLog bool) *tracer {
	return &tracer{
		log:       keepLog,
		committed: map[int32]int64{},
		notify:    make(chan struct{}, 1),
		phases:    Phases{Statements: map[string]float64{}},
	}
}

func (t *tracer) tx(conn *pgx.Conn) *txTrace {
	v, ok := t.conns.Load(conn)
	if !ok {
		v, _ = t.conns.LoadOrStore(conn, &txTrace{})
	}
	return v.(*txTrace)
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	var sql string
	switch {
	case strings.HasPrefix(data.SQL, "begin"):
		sql = "begin"
		tt := t.tx(conn)
		*tt = txTrace{beginStart: time.Now()}
	case data.SQL == "commit":
		sql = "commit"
		t.tx(conn).commitStart = time.Now()
	default:
		return ctx
	}
	return context.WithValue(ctx, keyQuery, sql)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(keyQuery).(string)
	switch sql {
	case "begin":
		t.tx(conn).beginEnd = time.Now()
	case "commit":
		now := time.Now()
		tt := t.tx(conn)
		defer func() { *tt = txTrace{} }() // the next transaction starts clean
		if data.Err != nil || data.CommandTag.String() != "COMMIT" || tt.advance == nil || tt.writeEnd.IsZero() {
			return
		}
		if tt.loadEnd.IsZero() { // every aggregate came from the state cache
			tt.loadStart, tt.loadEnd = tt.beginEnd, tt.beginEnd
		}
		c := *tt.advance
		c.At = now.UnixNano()
		t.mu.Lock()
		if c.To > t.committed[c.Partition] {
			t.committed[c.Partition] = c.To
		}
		t.lastAt = now
		t.rowWrites += tt.rows
		if t.log {
			t.commits = append(t.commits, c)
		}
		p := &t.phases
		p.Batches++
		p.Begin += tt.beginEnd.Sub(tt.beginStart).Seconds()
		p.Load += tt.loadEnd.Sub(tt.loadStart).Seconds()
		p.Plan += tt.writeStart.Sub(tt.loadEnd).Seconds()
		p.Write += tt.writeEnd.Sub(tt.writeStart).Seconds()
		p.Commit += now.Sub(tt.commitStart).Seconds()
		t.mu.Unlock()
		select {
		case t.notify <- struct{}{}:
		default:
		}
	}
}

const (
	batchLoad = iota + 1
	batchWrite
)

// TraceBatchStart implements pgx.BatchTracer.
func (t *tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	kind := batchLoad
	for _, q := range data.Batch.QueuedQueries {
		if strings.HasPrefix(strings.TrimSpace(q.SQL), "UPDATE projector_offsets") {
			kind = batchWrite
		}
	}
	tt := t.tx(conn)
	if kind == batchLoad {
		tt.loadStart = time.Now()
	} else {
		tt.writeStart = time.Now()
	}
	return context.WithValue(ctx, keyBatch, kind)
}

// TraceBatchQuery implements pgx.BatchTracer.
func (t *tracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	name := statementName(data.SQL)
	if !data.ReadStartTime.IsZero() {
		d := time.Since(data.ReadStartTime).Seconds()
		t.mu.Lock()
		t.phases.Statements[name] += d
		t.mu.Unlock()
	}
	if data.Err != nil {
		return
	}
	tt := t.tx(conn)
	switch name {
	case "advance offset":
		if data.CommandTag.RowsAffected() != 1 || len(data.Args) < 6 {
			return // fenced: rolled back
		}
		end, ok1 := data.Args[0].(int64)
		part, ok2 := data.Args[3].(int32)
		from, ok3 := data.Args[5].(int64)
		if ok1 && ok2 && ok3 {
			tt.advance = &Commit{Partition: part, From: from, To: end}
		}
	case "upsert rows", "update rows":
		// One row per version: the last []int64 argument (an insert of
		// aggregates assumed new has their keys and table after it).
		for i := len(data.Args) - 1; i >= 0; i-- {
			if v, ok := data.Args[i].([]int64); ok {
				tt.rows += int64(len(v))
				break
			}
		}
	case "delete rows":
		if len(data.Args) > 0 {
			if v, ok := data.Args[0].([]string); ok {
				tt.rows += int64(len(v))
			}
		}
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	tt := t.tx(conn)
	if k, _ := ctx.Value(keyBatch).(int); k == batchWrite {
		tt.writeEnd = time.Now()
	} else {
		tt.loadEnd = time.Now()
	}
}

// statementName names an engine statement by its SQL.
func statementName(sql string) string {
	s := strings.TrimSpace(sql)
	switch {
	case strings.HasPrefix(s, "SELECT k.key"):
		return "load rows"
	case strings.HasPrefix(s, "SELECT key, version"):
		return "load parked"
	case strings.HasPrefix(s, "UPDATE projector_offsets"):
		return "advance offset"
	case strings.HasPrefix(s, "UPDATE"):
		return "update rows"
	case strings.HasPrefix(s, "SELECT set_config"):
		return "plan settings"
	case strings.HasPrefix(s, "INSERT INTO projector_tombstones"):
		return "tombstones"
	case strings.HasPrefix(s, "INSERT INTO projector_parked"):
		return "park"
	case strings.HasPrefix(s, "DELETE FROM projector_parked"):
		return "unpark"
	case strings.HasPrefix(s, "DELETE FROM projector_tombstones"):
		return "prune tombstones" // the engine's background pruning, not a batch's
	case strings.HasPrefix(s, "WITH u AS"):
		return "dead letters"
	case strings.HasPrefix(s, "DELETE FROM"):
		return "delete rows"
	case strings.HasPrefix(s, "INSERT INTO"):
		return "upsert rows"
	}
	return "other"
}

// reached reports whether every partition has committed up to end, and
// when the last commit happened.
func (t *tracer) reached(end map[int32]int64) (bool, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p, e := range end {
		if t.committed[p] < e {
			return false, time.Time{}
		}
	}
	return true, t.lastAt
}

func (t *tracer) result() (int64, Phases, []Commit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ph := t.phases
	ph.Statements = map[string]float64{}
	for k, v := range t.phases.Statements {
		ph.Statements[k] = v
	}
	return t.rowWrites, ph, append([]Commit(nil), t.commits...)
}
