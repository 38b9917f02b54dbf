package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector-dev/projector/sinks"
)

// A COMMIT whose reply never arrives (the connection broke after it was
// sent) may have landed or not. Retried as if it had not, the batch's
// fenced offset update finds the offset already moved and the worker
// would take itself for a zombie. So the sink reads the stored offset:
// still this claim's epoch and at the end the commit wrote means it
// landed.

// storedOffset is a partition's row in projector_offsets.
type storedOffset struct {
	epoch int64
	next  *int64
}

// landed reports whether the row is what a commit of claim up to end
// leaves.
func (st storedOffset) landed(claim sinks.Claim, end int64) bool {
	return st.epoch == claim.Epoch && st.next != nil && *st.next == end
}

// storedOffsetSQL reads a partition's stored offset. FOR SHARE waits for a
// transaction still holding the row (a COMMIT the server is still
// carrying out), so that what it reads is final.
const storedOffsetSQL = `SELECT owner_epoch, next_offset FROM projector_offsets
	WHERE identity = $1 AND topic = $2 AND partition = $3`

func readStored(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, identity string, tp sinks.TP, lock bool) (storedOffset, error) {
	sql := storedOffsetSQL
	if lock {
		sql += " FOR SHARE"
	}
	var st storedOffset
	if err := q.QueryRow(ctx, sql, identity, tp.Topic, tp.Partition).Scan(&st.epoch, &st.next); err != nil {
		return st, fmt.Errorf("read stored offset of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return st, nil
}

// outcomeUnknown reports whether a failed COMMIT may have landed: the
// server did not answer with an error. pgx's SafeToRetry does not tell:
// a COMMIT whose reply was cut off can fail as "conn closed", which it
// counts as never sent.
func outcomeUnknown(err error) bool {
	var pg *pgconn.PgError
	return !errors.As(err, &pg)
}

// commitLanded reads whether the commit of claim's batch up to end
// landed. It waits for a connection and the row at most acquireTimeout,
// even once ctx has ended: a stopping worker still learns what it did.
// It returns sinks.ErrFenced when a newer owner has claimed the
// partition.
func (s *Sink) commitLanded(ctx context.Context, claim sinks.Claim, end int64) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.acquireTimeout)
	defer cancel()
	conn, err := acquire(ctx, s.pool, s.acquireTimeout)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	st, err := readStored(ctx, conn, s.identity, claim.TP, true)
	if err != nil {
		return false, err
	}
	if st.epoch != claim.Epoch {
		return false, sinks.ErrFenced
	}
	return st.landed(claim, end), nil
}

// unsureCommits are the batches, by partition, whose COMMIT lost its
// reply when whether it landed could not be read: the next attempt reads
// it first.
type unsureCommits struct {
	mu   sync.Mutex
	ends map[sinks.TP]unsureCommit
}

type unsureCommit struct {
	epoch, start, end int64
}

// note records that claim's commit up to end may have landed.
func (u *unsureCommits) note(claim sinks.Claim, end int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ends == nil {
		u.ends = map[sinks.TP]unsureCommit{}
	}
	u.ends[claim.TP] = unsureCommit{epoch: claim.Epoch, start: claim.NextOffset, end: end}
}

// take removes and returns the end of claim's unsure commit, if the last
// one noted is of this claim from the same offset.
func (u *unsureCommits) take(claim sinks.Claim) (int64, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	c, ok := u.ends[claim.TP]
	if !ok {
		return 0, false
	}
	delete(u.ends, claim.TP)
	return c.end, c.epoch == claim.Epoch && c.start == claim.NextOffset
}

func (u *unsureCommits) forget(tp sinks.TP) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.ends, tp)
}
