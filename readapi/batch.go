package readapi

import (
	"context"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/projection"
)

// Reads by key that arrive together are read together, in one
// statement: a read by key costs the database and the API mostly the
// round trip (a write and a read on each side, and a wake-up of the
// backend), not the index probe, so under load one round trip for several
// keys serves more reads a second with less of the database's CPU.
//
// Nothing waits for a batch to fill. While no more reads of a projection
// and tenant are under way than the pool has connections, each runs a
// statement of its own at once, as it would without batches. Beyond that
// the API is loaded: a read runs at once only when no statement of its
// projection and tenant runs; one that arrives while a statement runs
// waits for it and goes with the others that arrived meanwhile in the
// next, which costs it at most that statement's time. Another statement
// starts beside the running ones, up to the pool's size, once
// parallelAfter reads wait: a statement slow in the database (keys read
// from disk, one after the other) then does not hold back the reads
// queued behind it.
const (
	// maxBatch bounds the keys of one statement.
	maxBatch = 64
	// parallelAfter is how many reads wait before another statement
	// starts beside those running.
	parallelAfter = 16
	// defaultBatches is how many statements of a projection and tenant
	// run at once when the pool's size is not known.
	defaultBatches = 4
	// batchKeyColumn names the keys asked for in the batch's statement.
	batchKeyColumn = "projector_requested_key"
)

// getManySQL is the statements that read the rows of several keys at
// once, with and without the tenant's condition: "" when the table has a
// column named batchKeyColumn, whose name the statement takes.
func getManySQL(p *projection.Projection, cols []column) (all, tenant string) {
	keyType := ""
	for _, c := range cols {
		if c.name == batchKeyColumn {
			return "", ""
		}
		if c.name == p.KeyColumn {
			keyType = c.typ
		}
	}
	if keyType == "" {
		return "", ""
	}
	requested := "projector_keys." + batchKeyColumn
	// A text key is compared as text; another is cast to its type without
	// a modifier, as the single read's parameter is, with the same errors
	// for a key that type cannot hold.
	match := requested
	if keyType != "text" && keyType != "character varying" {
		match += "::" + keyType
	}
	all = "SELECT " + selectList(cols) + ", " + requested + " FROM unnest($1::text[]) AS projector_keys(" + batchKeyColumn + ") JOIN " +
		quoteTable(p.Table) + " ON " + pgx.Identifier{p.KeyColumn}.Sanitize() + " = " + match
	if p.Tenant != "" {
		// The tenant's keys are found first, in a subquery the planner
		// keeps apart (OFFSET 0), so that the join reads only their rows.
		tenant = "SELECT " + selectList(cols) + ", " + requested + " FROM (SELECT " + batchKeyColumn +
			" FROM unnest($1::text[]) AS projector_keys(" + batchKeyColumn + ") WHERE " + tenantProbe(p, match) +
			" OFFSET 0) AS projector_keys JOIN " + quoteTable(p.Table) + " ON " + pgx.Identifier{p.KeyColumn}.Sanitize() + " = " + match +
			" AND " + pgx.Identifier{p.Tenant}.Sanitize() + " = $2"
	}
	return all, tenant
}

// batches gathers a projection's reads by key, a queue per tenant.
type batches struct {
	limit  int // batches of a queue running at once
	mu     sync.Mutex
	queues map[string]*getQueue
}

// getQueue is the reads by key of one projection and tenant.
type getQueue struct {
	reads   int        // reads under way: in a running statement or waiting
	running int        // statements running
	pending []*getCall // reads waiting for the next
}

// getCall is one read by key waiting in a queue.
type getCall struct {
	key string
	// done is buffered: whoever answers never blocks. It is nil for the
	// call that runs the batch, which nobody answers.
	done chan getResult
}

// getResult is a read's answer, or its turn to run the next batch.
type getResult struct {
	row   *readRow // nil: no row
	err   error
	lead  bool // run the next batch
	alone bool // read the key alone: the batch failed on another's key
}

// poolSize is the pool's size when db is a pgxpool.Pool, else 0.
func poolSize(db Querier) int {
	if p, ok := db.(*pgxpool.Pool); ok {
		return int(p.Config().MaxConns)
	}
	return 0
}

// getByKey reads the row of key (and tenant, when not "") in v's table:
// nil when there is none.
func (a *API) getByKey(ctx context.Context, v *view, tbl *table, key, tenant string) (*readRow, error) {
	many := tbl.getMany
	if tenant != "" {
		many = tbl.getManyTenant
	}
	if many == "" {
		return a.getOne(ctx, v, tbl, key, tenant)
	}
	b := &v.batches
	b.mu.Lock()
	q := b.queues[tenant]
	if q == nil {
		q = &getQueue{}
		b.queues[tenant] = q
	}
	q.reads++
	var row *readRow
	var err error
	served := 1    // the reads the statement run here answers
	alone := false // the batch failed on another's key: read this one again
	switch {
	case q.reads <= b.limit && len(q.pending) == 0, q.running == 0:
		// A connection for each read, or nothing runs: at once, alone.
		q.running++
		b.mu.Unlock()
		row, err = a.getOne(ctx, v, tbl, key, tenant)
	case q.reads <= b.limit, q.running < b.limit && len(q.pending)+1 >= parallelAfter:
		// Some wait though a connection is left for each read (since a
		// busier moment), or enough wait to fill a statement beside those
		// running: at once, with them.
		q.running++
		batch := take(q, &getCall{key: key})
		b.mu.Unlock()
		mine := a.runBatch(ctx, v, tbl, many, tenant, batch)
		row, err, alone, served = mine.row, mine.err, mine.alone, len(batch)
	default:
		self := &getCall{key: key, done: make(chan getResult, 1)}
		q.pending = append(q.pending, self)
		b.mu.Unlock()
		// The wait is bounded by the batches before it, each by the
		// statement timeout; a client that leaves still gets its read.
		r := <-self.done
		switch {
		case r.alone:
			return a.getOne(ctx, v, tbl, key, tenant)
		case !r.lead:
			return r.row, r.err
		}
		b.mu.Lock()
		batch := take(q, self)
		b.mu.Unlock()
		mine := a.runBatch(ctx, v, tbl, many, tenant, batch)
		row, err, alone, served = mine.row, mine.err, mine.alone, len(batch)
	}
	b.mu.Lock()
	q.reads -= served
	if len(q.pending) > 0 {
		next := q.pending[0]
		q.pending = q.pending[1:]
		b.mu.Unlock()
		next.done <- getResult{lead: true}
	} else {
		q.running--
		if q.running == 0 {
			delete(b.queues, tenant) // a tenant's queue lives while it reads
		}
		b.mu.Unlock()
	}
	if alone {
		return a.getOne(ctx, v, tbl, key, tenant)
	}
	return row, err
}

// take removes up to maxBatch-1 reads from q's pending, the oldest first,
// and returns them with self after them. The caller holds the lock.
func take(q *getQueue, self *getCall) []*getCall {
	n := min(len(q.pending), maxBatch-1)
	batch := append(make([]*getCall, 0, n+1), q.pending[:n]...)
	q.pending = slices.Delete(q.pending, 0, n)
	if len(q.pending) == 0 {
		q.pending = nil
	}
	return append(batch, self)
}

// runBatch reads the keys of batch, whose last call is the caller's, and
// answers the others; it returns the caller's answer.
func (a *API) runBatch(ctx context.Context, v *view, tbl *table, many, tenant string, batch []*getCall) getResult {
	self := batch[len(batch)-1]
	if len(batch) == 1 {
		row, err := a.getOne(ctx, v, tbl, self.key, tenant)
		return getResult{row: row, err: err}
	}
	keys := make([]string, len(batch))
	for i, c := range batch {
		keys[i] = c.key
	}
	args := []any{keys}
	if tenant != "" {
		args = append(args, tenant)
	}
	// The others' reads do not end when the caller's client leaves.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.StatementTimeout)
	defer cancel()
	rows, err := a.query(qctx, v, tbl.cols, many, args, len(batch), true)
	var answer func(c *getCall) getResult
	switch {
	case err != nil && isDataException(err):
		// A key its column's type cannot hold: each reads its own.
		answer = func(*getCall) getResult { return getResult{alone: true} }
	case err != nil:
		answer = func(*getCall) getResult { return getResult{err: err} }
	default:
		byKey := make(map[string]*readRow, len(rows))
		for i := range rows {
			byKey[rows[i].key] = &rows[i]
		}
		answer = func(c *getCall) getResult { return getResult{row: byKey[c.key]} }
	}
	for _, c := range batch[:len(batch)-1] {
		c.done <- answer(c)
	}
	return answer(self)
}

// getOne reads the row of key alone.
func (a *API) getOne(ctx context.Context, v *view, tbl *table, key, tenant string) (*readRow, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.StatementTimeout)
	defer cancel()
	args := []any{key}
	sql := tbl.get
	if tenant != "" {
		args = append(args, tenant)
		sql = tbl.getTenant
	}
	rows, err := a.query(ctx, v, tbl.cols, sql, args, 1, false)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return &rows[0], nil
}
