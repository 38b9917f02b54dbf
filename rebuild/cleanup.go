package rebuild

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// cleanup removes what operations that ended without cutting over left
// (the new generation's table and identity; a rollback's table goes back
// to its retired name), and drops retired generations past their
// retention. It reports whether there was any to look at.
func (s *Supervisor) cleanup(ctx context.Context) (found bool) {
	rows, err := s.cfg.Store.pool.Query(ctx, `SELECT `+opColumns+` FROM projector_rebuilds
		WHERE identity = $1 AND state IN ('failed', 'cancelled') AND cleaned_at IS NULL`, s.cfg.Identity)
	if err != nil {
		return false
	}
	ops, err := pgx.CollectRows(rows, scanOperation)
	if err != nil {
		return false
	}
	found = len(ops) > 0
	for _, op := range ops {
		err := s.clean(ctx, op)
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, ErrGroupInUse):
			// Its engines stop within a check on every replica.
			s.cfg.Logger.Debug("cleanup waits for the generation's engines to leave its consumer group", "operation_id", op.ID)
		default:
			s.cfg.Logger.Warn("could not clean up after a rebuild operation; trying again", "operation_id", op.ID, "err", err)
		}
	}
	gs, err := s.cfg.Store.expired(ctx, s.cfg.Identity)
	if err != nil {
		return found
	}
	found = found || len(gs) > 0
	for _, g := range gs {
		if err := s.cfg.Store.Drop(ctx, g, s.cfg.Admin); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("could not drop a retired generation; trying again", "projection", g.Projection, "generation", g.N, "err", err)
			continue
		}
		s.cfg.Logger.Info("dropped a retired generation past its retention", "projection", g.Projection, "generation", g.N, "table", retiredName(g.PhysicalTable))
	}
	return found
}

func (s *Supervisor) clean(ctx context.Context, op Operation) error {
	var dropped *Generation
	err := pgx.BeginFunc(ctx, s.cfg.Store.pool, func(tx pgx.Tx) error {
		var cleaned bool
		if err := tx.QueryRow(ctx, `SELECT cleaned_at IS NOT NULL FROM projector_rebuilds WHERE id = $1 FOR UPDATE SKIP LOCKED`, op.ID).Scan(&cleaned); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		}
		if cleaned {
			return nil
		}
		g, err := targetOf(ctx, tx, op)
		if err != nil {
			return err
		}
		switch {
		case g != nil && op.Kind == KindRollback && g.State == Retired:
			// Back to its retired name; its engines, wherever they
			// still run, are fenced.
			if err := renameIfExists(ctx, tx, g.PhysicalTable, retiredName(g.PhysicalTable)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE projector_offsets SET owner_epoch = owner_epoch + 1 WHERE identity = $1`, g.GroupID); err != nil {
				return err
			}
		case op.Kind == KindRebuild:
			// targetOf hides cancelled generations: read it as it is.
			rows, err := tx.Query(ctx, `SELECT `+genColumns+` FROM projector_generations WHERE identity = $1 AND projection = $2 AND generation = $3 AND state = 'cancelled'`,
				op.Identity, op.Projection, op.Generation)
			if err != nil {
				return err
			}
			gs, err := pgx.CollectRows(rows, scanGeneration)
			if err != nil {
				return err
			}
			if len(gs) == 1 {
				if err := dropState(ctx, tx, gs[0], gs[0].PhysicalTable, s.cfg.Admin); err != nil {
					return err
				}
				dropped = &gs[0]
			}
		}
		_, err = tx.Exec(ctx, `UPDATE projector_rebuilds SET cleaned_at = now() WHERE id = $1`, op.ID)
		return err
	})
	if err == nil && dropped != nil {
		s.cfg.Logger.Info("removed the table and identity of a generation whose rebuild did not complete", "operation_id", op.ID,
			"projection", op.Projection, "generation", op.Generation, "table", dropped.PhysicalTable, "group", dropped.GroupID)
	}
	return err
}

// expired returns identity's retired generations past their retention.
func (s *Store) expired(ctx context.Context, identity string) ([]Generation, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+genColumns+` FROM projector_generations
		WHERE identity = $1 AND state = 'retired' AND retain_until <= now()`, identity)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanGeneration)
}

// Drop drops the retired generation g: its table, stored offsets, parked
// events, partition states and tombstones, and its Kafka consumer group
// (admin may be nil: the group is then left).
func (s *Store) Drop(ctx context.Context, g Generation, admin Admin) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE projector_generations SET state = 'dropped', dropped_at = now()
			WHERE identity = $1 AND projection = $2 AND generation = $3 AND state = 'retired'`, g.Identity, g.Projection, g.N)
		if err != nil || tag.RowsAffected() == 0 {
			return err // none: another replica dropped it, or a rollback took it
		}
		return dropState(ctx, tx, g, retiredName(g.PhysicalTable), admin)
	})
	if err != nil {
		return fmt.Errorf("drop generation %d of %s: %w", g.N, g.Projection, err)
	}
	return nil
}

// dropState removes table and what generation g's identity stored, in
// tx; the Kafka group last, so that its failure undoes the rest.
func dropState(ctx context.Context, tx pgx.Tx, g Generation, table string, admin Admin) error {
	if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+quoteTable(table)); err != nil {
		return fmt.Errorf("drop table %s: %w", table, err)
	}
	for _, t := range []string{"projector_offsets", "projector_parked", "projector_partition_states", "projector_dead_letters"} {
		if _, err := tx.Exec(ctx, `DELETE FROM `+t+` WHERE identity = $1`, g.GroupID); err != nil {
			return fmt.Errorf("delete the rows of %s in %s: %w", g.GroupID, t, err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM projector_tombstones WHERE table_name = $1`, g.PhysicalTable); err != nil {
		return fmt.Errorf("delete the tombstones of %s: %w", g.PhysicalTable, err)
	}
	if admin != nil && g.GroupID != g.Identity {
		if err := admin.DeleteGroup(ctx, g.GroupID); err != nil {
			return fmt.Errorf("delete consumer group %s: %w", g.GroupID, err)
		}
	}
	return nil
}
