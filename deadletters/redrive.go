package deadletters

import (
	"context"
	"encoding/json"
	"fmt"
	"os/user"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/sinks"
)

// StatusQueued: waiting in the redrive queue for the worker that owns its
// partition (see Redrive).
const StatusQueued = "queued"

// AuditRedrive is the audit action of a redrive queued; AuditRedriven the
// owning worker's, written in the transaction that applied it.
const (
	AuditRedrive  = "redrive"
	AuditRedriven = "redriven"
)

// Redrive limits: how many dead letters one request queues by default,
// and at most.
const (
	RedriveDefaultLimit = 1000
	RedriveMaxLimit     = 10000
)

// Actor is who did an administrative action: the name given (an
// operator's --actor, or an API's authenticated subject) and the
// operating-system user of the command that did it ("" when not a
// command). The database session user is taken by the statement that
// writes the audit row, in the transaction of the action.
type Actor struct {
	Name   string `json:"actor"`
	OSUser string `json:"os_user,omitempty"`
}

// CommandActor is the actor of a command run by the current
// operating-system user, named name (the user's name when empty).
func CommandActor(name string) Actor {
	a := Actor{Name: name}
	if u, err := user.Current(); err == nil {
		a.OSUser = u.Username
	}
	if a.Name == "" {
		a.Name = a.OSUser
	}
	if a.Name == "" {
		a.Name = "unknown"
	}
	return a
}

// Querier runs statements and queries: a pool, a connection or a
// transaction.
type Querier interface {
	Execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AuditAs records, in db (the transaction of the action, for the audit
// row to commit with it), that who did action to the dead letters ids,
// selected by filter (stored as JSON; nil: {}), with the database
// session user.
func AuditAs(ctx context.Context, db Execer, who Actor, action string, filter any, ids []int64, detail string) error {
	f := []byte("{}")
	if filter != nil {
		var err error
		if f, err = json.Marshal(filter); err != nil {
			return fmt.Errorf("audit %s: filter: %w", action, err)
		}
	}
	if ids == nil {
		ids = []int64{}
	}
	_, err := db.Exec(ctx, `INSERT INTO projector_dlq_audit (actor, os_user, db_user, action, filter, entry_ids, detail)
		VALUES ($1, $2, session_user, $3, $4::jsonb, $5::bigint[], $6)`, who.Name, who.OSUser, action, string(f), ids, detail)
	if err != nil {
		return fmt.Errorf("audit %s: %w", action, err)
	}
	return nil
}

// Queued is one dead letter Redrive queued.
type Queued struct {
	ID         int64 `json:"id"` // the dead letter's
	Identity   string
	Projection string
	sinks.TP
}

// Redrive queues the dead letters ids for the workers that own their
// partitions (each its own topic and partition, under its identity) to
// apply them again, and audits it, in one transaction: a dead letter
// open or replayed becomes queued; one already queued, resolved or
// purged is left alone (not in the result). filter is what selected
// them, for the audit log.
func Redrive(ctx context.Context, pool *pgxpool.Pool, ids []int64, who Actor, filter any) ([]Queued, error) {
	var out []Queued
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		out, err = RedriveTx(ctx, tx, ids, who, filter)
		return err
	})
	return out, err
}

// RedriveTx is Redrive in tx, for a caller that commits it with its own
// writes.
func RedriveTx(ctx context.Context, tx pgx.Tx, ids []int64, who Actor, filter any) ([]Queued, error) {
	if len(ids) > RedriveMaxLimit {
		return nil, fmt.Errorf("redrive %d dead letters: at most %d in one request", len(ids), RedriveMaxLimit)
	}
	rows, err := tx.Query(ctx, `WITH d AS (
		UPDATE projector_dead_letters SET status = 'queued'
		WHERE id = ANY($1::bigint[]) AND status IN ('open', 'replayed')
		RETURNING id, identity, projection, topic, partition)
	INSERT INTO projector_redrives (identity, projection, topic, partition, dead_letter_id, requested_by, os_user)
	SELECT identity, projection, topic, partition, id, $2, $3 FROM d ORDER BY id
	RETURNING dead_letter_id, identity, projection, topic, partition`, ids, who.Name, who.OSUser)
	if err != nil {
		return nil, fmt.Errorf("queue %d dead letters for redrive: %w", len(ids), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Queued, error) {
		var q Queued
		err := r.Scan(&q.ID, &q.Identity, &q.Projection, &q.Topic, &q.Partition)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue %d dead letters for redrive: %w", len(ids), err)
	}
	queued := make([]int64, len(out))
	for i, q := range out {
		queued[i] = q.ID
	}
	if err := AuditAs(ctx, tx, who, AuditRedrive, filter, queued,
		fmt.Sprintf("queued %d of %d for the workers that own their partitions", len(out), len(ids))); err != nil {
		return nil, err
	}
	return out, nil
}

// Redrives reads the redrive queue of one consumer identity for its
// engine and workers.
type Redrives struct {
	Pool     *pgxpool.Pool
	Identity string
}

// Waiting returns the partitions with dead letters queued: one
// index-only look at the queue, what an engine pays each interval
// whether or not anything is queued.
func (r Redrives) Waiting(ctx context.Context) ([]sinks.TP, error) {
	rows, err := r.Pool.Query(ctx, `SELECT DISTINCT topic, partition FROM projector_redrives WHERE identity = $1`, r.Identity)
	if err != nil {
		return nil, fmt.Errorf("read the redrive queue: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sinks.TP, error) {
		var tp sinks.TP
		err := row.Scan(&tp.Topic, &tp.Partition)
		return tp, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the redrive queue: %w", err)
	}
	return out, nil
}

// Claim returns the oldest limit redrives queued for partition tp, with
// their dead letters' records. It locks nothing: the transaction that
// applies them removes them from the queue, and a worker fenced in the
// meantime commits nothing.
func (r Redrives) Claim(ctx context.Context, tp sinks.TP, limit int) ([]sinks.Redrive, error) {
	rows, err := r.Pool.Query(ctx, `SELECT q.id, d.id, d.projection, d."offset", d.record_key, d.value, d.headers, d.record_time
		FROM (SELECT id, dead_letter_id FROM projector_redrives
		      WHERE identity = $1 AND topic = $2 AND partition = $3 ORDER BY id LIMIT $4) q
		CROSS JOIN LATERAL (SELECT * FROM projector_dead_letters d WHERE d.id = q.dead_letter_id LIMIT 1) d
		ORDER BY q.id`, r.Identity, tp.Topic, tp.Partition, limit)
	if err != nil {
		return nil, fmt.Errorf("claim queued redrives of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sinks.Redrive, error) {
		var (
			d       sinks.Redrive
			headers []byte
			ts      *time.Time
		)
		if err := row.Scan(&d.QueueID, &d.DeadLetter, &d.Projection, &d.Offset, &d.RecordKey, &d.Value, &headers, &ts); err != nil {
			return d, err
		}
		if ts != nil {
			d.Timestamp = *ts
		}
		if err := json.Unmarshal(headers, &d.Headers); err != nil {
			return d, fmt.Errorf("dead letter %d: headers: %w", d.DeadLetter, err)
		}
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim queued redrives of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return out, nil
}

// redrivenSQL, run in the transaction that applied the redrives $1 (queue
// ids) after their dead letters were resolved or reopened, takes them off
// the queue, counts the replay (a dead letter neither resolved nor
// reopened, its record parked behind a missing version, is replayed),
// and audits each requester's redrives with the outcome of each dead
// letter.
const redrivenSQL = `WITH q AS (
		DELETE FROM projector_redrives WHERE id = ANY($1::bigint[])
		RETURNING dead_letter_id, requested_by, os_user, db_user
	), d AS (
		UPDATE projector_dead_letters d SET replays = d.replays + 1, replayed_at = now(),
			status = CASE WHEN d.status = 'queued' THEN 'replayed' ELSE d.status END
		FROM q WHERE d.id = q.dead_letter_id
		RETURNING d.id, d.status
	)
	INSERT INTO projector_dlq_audit (actor, os_user, db_user, action, entry_ids, detail)
	SELECT q.requested_by, q.os_user, q.db_user, 'redriven', array_agg(q.dead_letter_id ORDER BY q.dead_letter_id),
	       $2 || ': ' || string_agg(d.id || ' ' || d.status, ', ' ORDER BY d.id)
	FROM q JOIN d ON d.id = q.dead_letter_id
	GROUP BY q.requested_by, q.os_user, q.db_user`

// QueueRedriven queues on b, the transaction that applied the redrives
// queueIDs through their partition's worker (by, e.g. its partition and
// epoch, for the audit log), the statement that settles them (see
// redrivenSQL). Queue it after the batch's dead-letter writes.
func QueueRedriven(b *pgx.Batch, queueIDs []int64, by string) {
	if len(queueIDs) > 0 {
		b.Queue(redrivenSQL, queueIDs, by)
	}
}

// PurgeTx deletes the dead letters ids in tx and audits it there, by
// who, for the purge and its audit row to commit together; filter is
// what selected them. It returns the ids it deleted.
func PurgeTx(ctx context.Context, tx pgx.Tx, ids []int64, who Actor, filter any) ([]int64, error) {
	rows, err := tx.Query(ctx, `DELETE FROM projector_dead_letters WHERE id = ANY($1::bigint[]) RETURNING id`, ids)
	if err != nil {
		return nil, fmt.Errorf("purge %d dead letters: %w", len(ids), err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("purge %d dead letters: %w", len(ids), err)
	}
	slices.Sort(done)
	if err := AuditAs(ctx, tx, who, AuditPurge, filter, done, fmt.Sprintf("purged %d of %d", len(done), len(ids))); err != nil {
		return nil, err
	}
	return done, nil
}
