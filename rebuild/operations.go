package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/projection"
)

// drive moves op on by one step, if this replica wins its row: every
// replica looks at every operation, and the one that locks it acts.
func (s *Supervisor) drive(ctx context.Context, op Operation, gs []Generation) {
	var err error
	switch op.State {
	case StateAccepted:
		err = s.begin(ctx, op, gs)
	case StateRunning:
		err = s.progress(ctx, op, gs)
	case StateCuttingOver:
		err = s.cutover(ctx, op, gs)
	}
	if err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("rebuild operation: a step failed; trying again", "operation_id", op.ID, "projection", op.Projection, "state", op.State, "err", err)
	}
}

// locked runs fn in a transaction holding op's row, unless another
// replica holds it (then fn does not run).
func (s *Supervisor) locked(ctx context.Context, op Operation, state string, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.cfg.Store.pool, func(tx pgx.Tx) error {
		var cur string
		err := tx.QueryRow(ctx, `SELECT state FROM projector_rebuilds WHERE id = $1 FOR UPDATE SKIP LOCKED`, op.ID).Scan(&cur)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur != state {
			return nil
		}
		return fn(tx)
	})
}

func generation(gs []Generation, projectionName string, n int) *Generation {
	for i := range gs {
		if gs[i].Projection == projectionName && gs[i].N == n {
			return &gs[i]
		}
	}
	return nil
}

func liveOf(gs []Generation, projectionName string) *Generation {
	for i := range gs {
		if gs[i].Projection == projectionName && gs[i].State == Live {
			return &gs[i]
		}
	}
	return nil
}

// begin takes an accepted operation to running: a rebuild checks the
// topic's history and creates the new generation's table; a rollback
// brings the retired generation's table back under its working name.
func (s *Supervisor) begin(ctx context.Context, op Operation, gs []Generation) error {
	return s.locked(ctx, op, StateAccepted, func(tx pgx.Tx) error {
		target, err := targetOf(ctx, tx, op)
		if err != nil {
			return err
		}
		if target == nil {
			return s.fail(ctx, tx, op, errorf(CodeGenerationGone, "generation %d of %s no longer exists", op.Generation, op.Projection))
		}
		p, err := target.compile(s.file[op.Projection])
		if err != nil {
			return s.fail(ctx, tx, op, errorf(CodeBadDefinition, "%v", err))
		}
		if op.Kind == KindRollback {
			if err := renameIfExists(ctx, tx, retiredName(target.PhysicalTable), target.PhysicalTable); err != nil {
				return fmt.Errorf("bring back %s: %w", target.PhysicalTable, err)
			}
			if _, err := tx.Exec(ctx, `UPDATE projector_generations SET state = 'building', retain_until = NULL
				WHERE identity = $1 AND projection = $2 AND generation = $3`, op.Identity, op.Projection, op.Generation); err != nil {
				return err
			}
		} else {
			deleted, err := s.history(ctx, p)
			if err != nil {
				return err
			}
			if len(deleted) > 0 && !op.AllowPartialHistory {
				return s.fail(ctx, tx, op, historyError(p.Topic, deleted))
			}
			if len(deleted) > 0 {
				b, _ := json.Marshal(deleted)
				if _, err := tx.Exec(ctx, `UPDATE projector_rebuilds SET deleted_records = $2 WHERE id = $1`, op.ID, b); err != nil {
					return err
				}
			}
			if err := s.cfg.Migrate(ctx, p); err != nil {
				return s.fail(ctx, tx, op, errorf(CodeBadDefinition, "create table %s: %v", p.Table, err))
			}
		}
		_, err = tx.Exec(ctx, `UPDATE projector_rebuilds SET state = 'running', started_at = now(), updated_at = now() WHERE id = $1`, op.ID)
		if err == nil {
			s.cfg.Logger.Info("rebuild operation running", "operation_id", op.ID, "projection", op.Projection, "kind", op.Kind, "generation", op.Generation)
		}
		return err
	})
}

func targetOf(ctx context.Context, q querier, op Operation) (*Generation, error) {
	rows, err := q.Query(ctx, `SELECT `+genColumns+` FROM projector_generations WHERE identity = $1 AND projection = $2 AND generation = $3`,
		op.Identity, op.Projection, op.Generation)
	if err != nil {
		return nil, err
	}
	gs, err := pgx.CollectRows(rows, scanGeneration)
	if err != nil || len(gs) == 0 {
		return nil, err
	}
	if gs[0].State == Dropped || gs[0].State == Cancelled {
		return nil, nil
	}
	return &gs[0], nil
}

// history returns the partitions of p's topic whose earliest records
// retention deleted, unless p does not need them: a snapshot projection
// with on_gap apply over a compacted topic keeps each key's last
// snapshot, which is all it reads.
func (s *Supervisor) history(ctx context.Context, p *projection.Projection) ([]Deleted, error) {
	starts, err := s.cfg.Admin.StartOffsets(ctx, p.Topic)
	if err != nil {
		return nil, fmt.Errorf("read the log start offsets of %s: %w", p.Topic, err)
	}
	var out []Deleted
	for part, start := range starts {
		if start > 0 {
			out = append(out, Deleted{Topic: p.Topic, Partition: part, Records: start})
		}
	}
	slices.SortFunc(out, func(a, b Deleted) int { return int(a.Partition - b.Partition) })
	if len(out) == 0 || p.Mode != projection.ModeSnapshot || p.OnGap != projection.GapApply {
		return out, nil
	}
	compacted, err := s.cfg.Admin.Compacted(ctx, p.Topic)
	if err != nil {
		return nil, fmt.Errorf("read the cleanup policy of %s: %w", p.Topic, err)
	}
	if compacted {
		return nil, nil
	}
	return out, nil
}

func historyError(topic string, deleted []Deleted) *Error {
	parts := make([]string, len(deleted))
	var total int64
	for i, d := range deleted {
		parts[i] = fmt.Sprintf("%d (%d records)", d.Partition, d.Records)
		total += d.Records
	}
	return errorf(CodeHistoryDeleted, "topic %s no longer holds its whole history: retention deleted the first %d records of partitions %s, which a rebuild from the earliest offset would need; start it with --allow-partial-history to rebuild from what is left",
		topic, total, strings.Join(parts, ", "))
}

// fail ends op as failed with err, in tx.
func (s *Supervisor) fail(ctx context.Context, tx pgx.Tx, op Operation, e *Error) error {
	if _, err := tx.Exec(ctx, `UPDATE projector_rebuilds SET state = 'failed', error_code = $2, error_message = $3, finished_at = now(), updated_at = now(), waiting = ''
		WHERE id = $1`, op.ID, e.Code, e.Message); err != nil {
		return err
	}
	next := Cancelled
	if op.Kind == KindRollback {
		next = Retired
	}
	if _, err := tx.Exec(ctx, `UPDATE projector_generations SET state = $4
		WHERE identity = $1 AND projection = $2 AND generation = $3 AND state = 'building'`, op.Identity, op.Projection, op.Generation, next); err != nil {
		return err
	}
	s.cfg.Logger.Error("rebuild operation failed", "operation_id", op.ID, "projection", op.Projection, "code", e.Code, "err", e.Message)
	return nil
}

// progressSample is what a replica last saw of an operation's progress.
type progressSample struct {
	at        time.Time
	done, end int64
	rate, arr float64
}

// position is where a generation stands on its topic.
type position struct {
	done, remaining int64
	behind          map[int32]int64 // records behind the log end, by partition
	missing         int             // partitions it has no stored offset for yet
	end             int64
}

func (s *Supervisor) position(ctx context.Context, g *Generation, topic string) (position, error) {
	starts, err := s.cfg.Admin.StartOffsets(ctx, topic)
	if err != nil {
		return position{}, err
	}
	ends, err := s.cfg.Admin.EndOffsets(ctx, topic)
	if err != nil {
		return position{}, err
	}
	stored, err := s.cfg.Store.offsets(ctx, g.GroupID, topic)
	if err != nil {
		return position{}, err
	}
	pos := position{behind: map[int32]int64{}}
	for part, end := range ends {
		start := starts[part]
		pos.end += end
		next, ok := stored[part]
		if !ok {
			pos.missing++
			next = start
		}
		next = max(next, start)
		pos.done += next - start
		pos.remaining += max(end-next, 0)
		pos.behind[part] = max(end-next, 0)
	}
	return pos, nil
}

// progress records a running operation's progress, and begins its
// cutover once every partition is near the log end.
func (s *Supervisor) progress(ctx context.Context, op Operation, gs []Generation) error {
	g := generation(gs, op.Projection, op.Generation)
	if g == nil || g.State != Building {
		return nil
	}
	p, err := g.compile(s.file[op.Projection])
	if err != nil {
		return err
	}
	// Only the replica holding the operation's row reads the position:
	// the others read what it stored.
	moved := false
	err = s.locked(ctx, op, StateRunning, func(tx pgx.Tx) error {
		pos, err := s.position(ctx, g, p.Topic)
		if err != nil {
			return err
		}
		cur := s.sample(op.ID, pos)
		caughtUp := pos.missing == 0
		for _, b := range pos.behind {
			if b > s.cfg.CutoverLag {
				caughtUp = false
			}
		}
		if caughtUp && pos.remaining > 0 && (cur.rate <= 0 || time.Duration(float64(pos.remaining)/cur.rate*float64(time.Second)) > s.cfg.CutoverSeconds) {
			caughtUp = false
		}
		if _, err := tx.Exec(ctx, `UPDATE projector_rebuilds SET records_done = $2, records_remaining = $3, rate = $4, arrival_rate = $5, updated_at = now()
			WHERE id = $1`, op.ID, pos.done, pos.remaining, cur.rate, cur.arr); err != nil {
			return err
		}
		if !caughtUp {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE projector_rebuilds SET state = 'cutting_over', cutover_at = now(), updated_at = now(),
			waiting = 'the new generation is near the log end: cutting over' WHERE id = $1`, op.ID); err != nil {
			return err
		}
		moved = true
		s.cfg.Logger.Info("rebuild operation cutting over", "operation_id", op.ID, "projection", op.Projection, "generation", op.Generation, "records_remaining", pos.remaining)
		return nil
	})
	if err != nil || !moved {
		return err
	}
	// At once rather than a check later: the new generation is near the
	// end now.
	s.limiter(g.GroupID, true)
	op.State = StateCuttingOver
	return s.cutover(ctx, op, gs)
}

// sample records pos as this replica's latest view of operation id and
// returns it with the rates since the one before.
func (s *Supervisor) sample(id string, pos position) progressSample {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.samples[id]
	cur := progressSample{at: now, done: pos.done, end: pos.end, rate: prev.rate, arr: prev.arr}
	if ok {
		if dt := now.Sub(prev.at).Seconds(); dt > 0 {
			cur.rate = smooth(prev.rate, float64(pos.done-prev.done)/dt)
			cur.arr = smooth(prev.arr, float64(pos.end-prev.end)/dt)
		}
	}
	s.samples[id] = cur
	return cur
}

func smooth(prev, cur float64) float64 {
	if prev == 0 {
		return cur
	}
	return 0.3*cur + 0.7*prev
}

// cutover tries the cutover of op once: when the new generation has
// reached the live one on every partition, and the locks come within
// LockTimeout. Otherwise it says why it waits, and tries again at the
// next step.
func (s *Supervisor) cutover(ctx context.Context, op Operation, gs []Generation) error {
	g := generation(gs, op.Projection, op.Generation)
	live := liveOf(gs, op.Projection)
	if g == nil || live == nil {
		return nil
	}
	p, err := g.compile(s.file[op.Projection])
	if err != nil {
		return err
	}
	retain := time.Duration(op.RetainSeconds) * time.Second
	if retain <= 0 {
		retain = s.cfg.Retain
	}
	err = s.cfg.Store.cutover(ctx, op, p.Topic, live, g, s.cfg.LockTimeout, s.cfg.CutoverWait, retain)
	var behind *behindError
	switch {
	case err == nil:
		s.cfg.Logger.Info("rebuild operation completed: the new generation is live", "operation_id", op.ID, "projection", op.Projection,
			"generation", op.Generation, "retired", live.N, "table", live.Table)
		return nil
	case errors.Is(err, errLockTimeout):
		s.waiting(ctx, op, s.cfg.Store.holder(ctx, live.Table))
		return nil
	case errors.As(err, &behind):
		s.waiting(ctx, op, behind.Error())
		return nil
	}
	return err
}

func (s *Supervisor) waiting(ctx context.Context, op Operation, why string) {
	if _, err := s.cfg.Store.pool.Exec(ctx, `UPDATE projector_rebuilds SET waiting = $2, updated_at = now() WHERE id = $1 AND state = 'cutting_over'`, op.ID, why); err != nil {
		s.cfg.Logger.Warn("could not record why the cutover waits", "operation_id", op.ID, "err", err)
	}
}
