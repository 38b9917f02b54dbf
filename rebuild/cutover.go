package rebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The cutover makes a generation live in one transaction:
//
//   - it takes the projection's name (the table of generation 1, or the
//     view of a later live generation) in ACCESS EXCLUSIVE mode, under a
//     short lock_timeout: a long reader in front of it makes the cutover
//     give up and try again, rather than queue every later reader behind
//     it for as long as that reader runs;
//   - it renames the old generation's table to <table>__g<N>_retired, so
//     that nothing writes it any more, and fences the old generation's
//     workers (their owner epochs move, or, for generation 1 sharing the
//     deployment's identity with other projections of its topic, the view
//     refuses their writes);
//   - the name becomes (or stays) a view of the new generation's table,
//     with the SELECT grants the old relation had, refusing writes;
//   - the generations' and the operation's states change with it.
//
// Readers holding the old relation finish on it; readers arriving after
// the commit read the new generation. Nobody sees an empty table or an
// older version: the new generation cuts over only once it has caught up.

// errLockTimeout reports a cutover that gave up waiting for its lock.
var errLockTimeout = errors.New("lock timeout")

// behindError reports a new generation that has not yet applied what the
// live one has on some partition: cutting over then would show readers
// older versions than they saw.
type behindError struct {
	partition int32
	records   int64
}

func (b *behindError) Error() string {
	return fmt.Sprintf("the new generation is %d records behind the live one on partition %d; waiting for it to reach it", b.records, b.partition)
}

// cutover runs the cutover transaction of op, which is cutting_over,
// from the live generation old to next. It holds the live generation's
// commits on the topic (their stored offsets' rows) for at most wait, for
// next to reach them on every partition.
func (s *Store) cutover(ctx context.Context, op Operation, topic string, old, next *Generation, lockTimeout, wait, retain time.Duration) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("cutover of %s: %w", op.Projection, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after commit
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, max(lockTimeout.Milliseconds(), 1))); err != nil {
		return fmt.Errorf("cutover of %s: %w", op.Projection, err)
	}
	var state string
	if err := tx.QueryRow(ctx, `SELECT state FROM projector_rebuilds WHERE id = $1 FOR UPDATE SKIP LOCKED`, op.ID).Scan(&state); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // another replica is at it
		}
		return lockErr(fmt.Errorf("cutover of %s: lock the operation: %w", op.Projection, err))
	}
	if state != StateCuttingOver {
		return nil // another replica completed it
	}
	// The live generation's position, held where it is.
	rows, err := tx.Query(ctx, `SELECT partition, next_offset FROM projector_offsets WHERE identity = $1 AND topic = $2 AND next_offset IS NOT NULL FOR UPDATE`, old.GroupID, topic)
	if err != nil {
		return lockErr(fmt.Errorf("cutover of %s: hold the commits of generation %d: %w", op.Projection, old.N, err))
	}
	held := map[int32]int64{}
	var part int32
	var next0 int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &next0}, func() error { held[part] = next0; return nil }); err != nil {
		return lockErr(fmt.Errorf("cutover of %s: hold the commits of generation %d: %w", op.Projection, old.N, err))
	}
	deadline := time.Now().Add(wait)
	for {
		reached, err := offsets(ctx, tx, next.GroupID, topic)
		if err != nil {
			return err
		}
		var behind *behindError
		for p, at := range held {
			if d := at - reached[p]; d > 0 && (behind == nil || d > behind.records) {
				behind = &behindError{partition: p, records: d}
			}
		}
		if behind == nil {
			break
		}
		if time.Now().After(deadline) {
			return behind
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	name := quoteTable(old.Table)
	if _, err := tx.Exec(ctx, `LOCK TABLE `+name+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return lockErr(fmt.Errorf("cutover of %s: lock %s: %w", op.Projection, old.Table, err))
	}
	grants, err := selectGrants(ctx, tx, old.Table)
	if err != nil {
		return err
	}
	var isView bool
	if err := tx.QueryRow(ctx, `SELECT relkind = 'v' FROM pg_class WHERE oid = to_regclass($1)`, old.Table).Scan(&isView); err != nil {
		return fmt.Errorf("cutover of %s: look up %s: %w", op.Projection, old.Table, err)
	}
	oldPhysical, oldGroup := old.PhysicalTable, old.GroupID
	if !isView {
		// Generation 1, whose table has the readers' name: it moves
		// aside, and takes its own identity with the offsets its table
		// is at, so that a rollback resumes it without the other
		// projections of the deployment's identity.
		oldPhysical = physicalName(old.Table, old.N)
		oldGroup = GroupID(op.Identity, op.Projection, old.N)
		if _, err := tx.Exec(ctx, `INSERT INTO projector_offsets AS o (identity, topic, partition, next_offset, owner_epoch)
			SELECT $2, topic, partition, next_offset, 1 FROM projector_offsets WHERE identity = $1 AND topic = $3
			ON CONFLICT (identity, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, owner_epoch = o.owner_epoch + 1, updated_at = now()`,
			old.GroupID, oldGroup, topic); err != nil {
			return fmt.Errorf("cutover of %s: keep the offsets of generation %d: %w", op.Projection, old.N, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE projector_parked SET identity = $2 WHERE identity = $1 AND projection = $3`,
			old.GroupID, oldGroup, op.Projection); err != nil {
			return fmt.Errorf("cutover of %s: keep the parked events of generation %d: %w", op.Projection, old.N, err)
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+name+` RENAME TO `+quoteIdent(lastPart(retiredName(oldPhysical)))); err != nil {
			return lockErr(fmt.Errorf("cutover of %s: retire %s: %w", op.Projection, old.Table, err))
		}
	} else {
		if _, err := tx.Exec(ctx, `ALTER TABLE `+quoteTable(old.PhysicalTable)+` RENAME TO `+quoteIdent(lastPart(retiredName(old.PhysicalTable)))); err != nil {
			return lockErr(fmt.Errorf("cutover of %s: retire %s: %w", op.Projection, old.PhysicalTable, err))
		}
		// Its workers' next commit is fenced.
		if _, err := tx.Exec(ctx, `UPDATE projector_offsets SET owner_epoch = owner_epoch + 1, updated_at = now() WHERE identity = $1`, old.GroupID); err != nil {
			return lockErr(fmt.Errorf("cutover of %s: fence generation %d: %w", op.Projection, old.N, err))
		}
	}
	if err := pointView(ctx, tx, old.Table, next.PhysicalTable, isView, grants); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE projector_generations SET state = 'retired', retired_at = now(), retain_until = now() + $4 * interval '1 millisecond',
		physical_table = $5, group_id = $6
		WHERE identity = $1 AND projection = $2 AND generation = $3`, op.Identity, op.Projection, old.N, retain.Milliseconds(), oldPhysical, oldGroup); err != nil {
		return fmt.Errorf("cutover of %s: retire generation %d: %w", op.Projection, old.N, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE projector_generations SET state = 'live', live_at = now(), retired_at = NULL, retain_until = NULL
		WHERE identity = $1 AND projection = $2 AND generation = $3`, op.Identity, op.Projection, next.N); err != nil {
		return fmt.Errorf("cutover of %s: make generation %d live: %w", op.Projection, next.N, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE projector_rebuilds SET state = 'completed', finished_at = now(), updated_at = now(), waiting = '', records_remaining = 0
		WHERE id = $1`, op.ID); err != nil {
		return fmt.Errorf("cutover of %s: complete the operation: %w", op.Projection, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return lockErr(fmt.Errorf("cutover of %s: commit: %w", op.Projection, err))
	}
	return nil
}

// pointView makes name a view of physical that refuses writes, keeping
// the view (and what depends on it) when the new column list extends the
// old one, replacing it otherwise.
func pointView(ctx context.Context, tx pgx.Tx, name, physical string, exists bool, grants []string) error {
	create := `CREATE VIEW ` + quoteTable(name) + ` AS SELECT * FROM ` + quoteTable(physical)
	if exists {
		if _, err := tx.Exec(ctx, `SAVEPOINT replace_view`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE OR REPLACE VIEW `+quoteTable(name)+` AS SELECT * FROM `+quoteTable(physical)); err == nil {
			return nil
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT replace_view`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DROP VIEW `+quoteTable(name)); err != nil {
			return fmt.Errorf("cutover: the new generation's columns do not extend the view %s's, and the view cannot be replaced: %w", name, err)
		}
	}
	if _, err := tx.Exec(ctx, create); err != nil {
		return fmt.Errorf("cutover: create the view %s: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TRIGGER projector_generation_view_write INSTEAD OF INSERT OR UPDATE OR DELETE ON `+quoteTable(name)+
		` FOR EACH ROW EXECUTE FUNCTION projector_generation_view_write()`); err != nil {
		return fmt.Errorf("cutover: make the view %s refuse writes: %w", name, err)
	}
	for _, g := range grants {
		if _, err := tx.Exec(ctx, `GRANT SELECT ON `+quoteTable(name)+` TO `+g); err != nil {
			return fmt.Errorf("cutover: grant SELECT on the view %s to %s: %w", name, g, err)
		}
	}
	return nil
}

// selectGrants returns the roles (quoted, or PUBLIC) that may SELECT the
// relation name, but its owner.
func selectGrants(ctx context.Context, tx pgx.Tx, name string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
		FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
		WHERE c.oid = to_regclass($1) AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner`, name)
	if err != nil {
		return nil, fmt.Errorf("cutover: read the grants on %s: %w", name, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// lockErr marks a lock timeout (55P03) as errLockTimeout.
func lockErr(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "55P03" {
		return fmt.Errorf("%w: %w", errLockTimeout, err)
	}
	return err
}

// holder describes who holds a lock on the relation name, for the
// operation's waiting reason: process id, how long its transaction has
// run, and its state (never its query, which may hold data).
func (s *Store) holder(ctx context.Context, name string) string {
	var pid int32
	var secs float64
	var state, app string
	err := s.pool.QueryRow(ctx, `SELECT a.pid, extract(epoch FROM now() - a.xact_start), coalesce(a.state, ''), coalesce(a.application_name, '')
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.relation = to_regclass($1) AND l.granted AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
		ORDER BY a.xact_start LIMIT 1`, name).Scan(&pid, &secs, &state, &app)
	if err != nil {
		return fmt.Sprintf("waiting for a lock on %s", name)
	}
	who := fmt.Sprintf("pid %d", pid)
	if app != "" {
		who += " (" + app + ")"
	}
	return fmt.Sprintf("waiting for a lock on %s: %s holds it, in a transaction open for %.0fs (%s); trying again", name, who, secs, state)
}

// renameIfExists renames the table from to to's last part (a table keeps
// its schema), when from exists: a step tried again after it landed finds
// nothing to do.
func renameIfExists(ctx context.Context, tx pgx.Tx, from, to string) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, from).Scan(&exists); err != nil {
		return fmt.Errorf("look up %s: %w", from, err)
	}
	if !exists {
		return nil
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE `+quoteTable(from)+` RENAME TO `+quoteIdent(lastPart(to))); err != nil {
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	return nil
}

func quoteTable(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

func lastPart(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[i+1:]
	}
	return name
}
