package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/projection"
)

// Generation states.
const (
	Building  = "building"  // a rebuild (or rollback) is filling its table
	Live      = "live"      // the projection's table name resolves to it
	Retired   = "retired"   // replaced; kept read-only for rollback until retain_until
	Dropped   = "dropped"   // retired and dropped: table, offsets and group gone
	Cancelled = "cancelled" // its operation was cancelled or failed before cutover
)

// Operation states.
const (
	StateAccepted    = "accepted"
	StateRunning     = "running"
	StateCuttingOver = "cutting_over"
	StateCompleted   = "completed"
	StateFailed      = "failed"
	StateCancelled   = "cancelled"
)

// Operation kinds.
const (
	KindRebuild  = "rebuild"
	KindRollback = "rollback"
)

// Stable error codes of operations and starts.
const (
	CodeInFlight       = "rebuild_in_flight"    // another operation of the projection is in flight
	CodeHistoryDeleted = "history_deleted"      // retention deleted records the rebuild needs
	CodeUnknown        = "unknown_projection"   // no generation of that projection
	CodeNothingRetired = "nothing_to_roll_back" // no retired generation to make live again
	CodeCutoverLost    = "cutover_won"          // the cancel came after the cutover began
	CodeBadDefinition  = "bad_definition"       // the definition does not compile
	CodeTableTooLong   = "table_name_too_long"  // <table>__g<N>_retired exceeds Postgres' 63 bytes
	CodeGenerationGone = "generation_gone"      // the generation to build on was dropped meanwhile
)

// Error is an error with a stable code, as operations and the admin API
// report it.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Generation is one generation of a projection.
type Generation struct {
	Identity      string // the deployment's identity
	Projection    string
	N             int
	State         string
	Table         string // the name readers use
	PhysicalTable string
	GroupID       string // consumer group and stored offsets' identity
	Definition    projection.Definition
	Hash          string
	CreatedAt     time.Time
	LiveAt        *time.Time
	RetiredAt     *time.Time
	RetainUntil   *time.Time
}

// Operation is one rebuild or rollback.
type Operation struct {
	ID                  string    `json:"operation_id"`
	Identity            string    `json:"identity"`
	Projection          string    `json:"projection"`
	Kind                string    `json:"kind"`
	Generation          int       `json:"generation"`
	FromGeneration      int       `json:"from_generation"`
	State               string    `json:"state"`
	AllowPartialHistory bool      `json:"allow_partial_history"`
	DeletedRecords      []Deleted `json:"deleted_records,omitempty"`
	Actor               string    `json:"actor,omitempty"`
	// OSUser and DBUser are the operating-system user of the command that
	// asked ("" through the API) and the database session user; the
	// Cancelled ones the same of whoever cancelled it, if anyone did.
	OSUser            string     `json:"os_user,omitempty"`
	DBUser            string     `json:"db_user,omitempty"`
	CancelledBy       string     `json:"cancelled_by,omitempty"`
	CancelledByOSUser string     `json:"cancelled_os_user,omitempty"`
	CancelledByDBUser string     `json:"cancelled_db_user,omitempty"`
	Error             *Error     `json:"error,omitempty"`
	Waiting           string     `json:"waiting,omitempty"`
	RecordsDone       int64      `json:"records_done"`
	RecordsRemaining  *int64     `json:"records_remaining"`
	Rate              *float64   `json:"events_per_second"`
	ArrivalRate       *float64   `json:"arrivals_per_second"`
	ETASeconds        *float64   `json:"eta_seconds"`
	Converging        *bool      `json:"converging"`
	CreatedAt         time.Time  `json:"created_at"`
	StartedAt         *time.Time `json:"started_at"`
	CutoverAt         *time.Time `json:"cutover_at"`
	FinishedAt        *time.Time `json:"finished_at"`
	UpdatedAt         time.Time  `json:"updated_at"`
	RetainSeconds     int64      `json:"retain_seconds"`
}

// Deleted is a partition whose earliest records retention deleted.
type Deleted struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Records   int64  `json:"records"` // the log start offset: records 0..Records-1 are gone
}

// Done reports whether the operation has ended.
func (o Operation) Done() bool {
	switch o.State {
	case StateCompleted, StateFailed, StateCancelled:
		return true
	}
	return false
}

// fillETA derives the estimate from the stored progress:
// remaining / (rebuild rate − arrival rate).
func (o *Operation) fillETA() {
	if o.RecordsRemaining == nil || o.Rate == nil || o.ArrivalRate == nil || o.Done() {
		return
	}
	net := *o.Rate - *o.ArrivalRate
	conv := net > 0 || *o.RecordsRemaining == 0
	o.Converging = &conv
	if *o.RecordsRemaining == 0 {
		z := 0.0
		o.ETASeconds = &z
		return
	}
	if net > 0 {
		eta := float64(*o.RecordsRemaining) / net
		o.ETASeconds = &eta
	}
}

// Store reads and writes generations and operations.
type Store struct {
	pool *pgxpool.Pool
	// osUser is the operating-system user recorded with the operations
	// the store starts, rolls back and cancels (see AsOSUser).
	osUser string
}

// AsOSUser returns the store recording osUser, the operating-system user
// of the command asking, with the operations it starts, rolls back and
// cancels, beside their actor and the database session user.
func (s *Store) AsOSUser(osUser string) *Store {
	c := *s
	c.osUser = osUser
	return &c
}

// NewStore returns the store on pool. Call Migrate first.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool is the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

const genColumns = `identity, projection, generation, state, table_name, physical_table, group_id,
	definition, reader_schema, definition_hash, created_at, live_at, retired_at, retain_until`

func scanGeneration(r pgx.CollectableRow) (Generation, error) {
	var g Generation
	var def string
	err := r.Scan(&g.Identity, &g.Projection, &g.N, &g.State, &g.Table, &g.PhysicalTable, &g.GroupID,
		&def, &g.Definition.Schema, &g.Hash, &g.CreatedAt, &g.LiveAt, &g.RetiredAt, &g.RetainUntil)
	g.Definition.YAML = []byte(def)
	return g, err
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Generations returns every generation of identity's projections that is
// not dropped or cancelled, by projection and number.
func (s *Store) Generations(ctx context.Context, identity string) ([]Generation, error) {
	return generations(ctx, s.pool, identity, "")
}

// OtherGenerations are identity's live generations and generations being
// built whose consumer group is not identity itself: the engines that
// keep offsets and dead letters under an identity of their own. None
// when no projection was ever rebuilt.
func (s *Store) OtherGenerations(ctx context.Context, identity string) ([]Generation, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('projector_generations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up the generations table: %w", err)
	}
	if !exists {
		return nil, nil
	}
	gs, err := s.Generations(ctx, identity)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(gs, func(g Generation) bool {
		return g.GroupID == identity || g.State != Live && g.State != Building
	}), nil
}

// DeadLetterFilter widens f's identity to its other generations' (see
// OtherGenerations), whose engines keep dead letters of their own: the
// filter returned selects the ids matching f under any of them, oldest
// first, up to f.Limit. f is returned as it is when it names no
// identity, or the identity has no other generation.
func (s *Store) DeadLetterFilter(ctx context.Context, f deadletters.Filter) (deadletters.Filter, error) {
	if f.Identity == "" {
		return f, nil
	}
	gens, err := s.OtherGenerations(ctx, f.Identity)
	if err != nil || len(gens) == 0 {
		return f, err
	}
	ids := []int64{}
	for _, id := range append([]string{f.Identity}, GroupIDs(gens)...) {
		one := f
		one.Identity = id
		got, err := deadletters.IDs(ctx, s.pool, one)
		if err != nil {
			return f, err
		}
		ids = append(ids, got...)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if f.Limit > 0 && len(ids) > f.Limit {
		ids = ids[:f.Limit]
	}
	f.Identity, f.IDs = "", ids
	return f, nil
}

// GroupIDs are the consumer groups of gens.
func GroupIDs(gens []Generation) []string {
	out := make([]string, len(gens))
	for i, g := range gens {
		out[i] = g.GroupID
	}
	return out
}

func generations(ctx context.Context, q querier, identity, projectionName string) ([]Generation, error) {
	rows, err := q.Query(ctx, `SELECT `+genColumns+` FROM projector_generations
		WHERE identity = $1 AND ($2 = '' OR projection = $2) AND state NOT IN ('dropped', 'cancelled')
		ORDER BY projection, generation`, identity, projectionName)
	if err != nil {
		return nil, fmt.Errorf("read generations of %s: %w", identity, err)
	}
	gs, err := pgx.CollectRows(rows, scanGeneration)
	if err != nil {
		return nil, fmt.Errorf("read generations of %s: %w", identity, err)
	}
	return gs, nil
}

// Live returns the live generation of each of identity's projections
// that has one, by projection name; none before Migrate created the
// tables (a first start reads them before it creates anything).
func (s *Store) Live(ctx context.Context, identity string) (map[string]Generation, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass('projector_generations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up the generations table: %w", err)
	}
	live := map[string]Generation{}
	if !exists {
		return live, nil
	}
	gs, err := generations(ctx, s.pool, identity, "")
	if err != nil {
		return nil, err
	}
	for _, g := range gs {
		if g.State == Live {
			live[g.Projection] = g
		}
	}
	return live, nil
}

// Ensure records generation 1 of each projection that has no generation
// yet, defined as p is (the first start of a release that keeps
// generations, or a new projection), and returns the live generation of
// each, by projection name.
func (s *Store) Ensure(ctx context.Context, identity string, projs []*projection.Projection) (map[string]Generation, error) {
	live := map[string]Generation{}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, p := range projs {
			def, err := p.Definition()
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO projector_generations
				(identity, projection, generation, state, table_name, physical_table, group_id, definition, reader_schema, definition_hash, live_at)
				SELECT $1, $2, 1, 'live', $3, $3, $1, $4, $5, $6, now()
				WHERE NOT EXISTS (SELECT 1 FROM projector_generations WHERE identity = $1 AND projection = $2)
				ON CONFLICT DO NOTHING`, identity, p.Name, p.Table, string(def.YAML), def.Schema, def.Hash()); err != nil {
				return fmt.Errorf("record generation 1 of projection %s: %w", p.Name, err)
			}
		}
		gs, err := generations(ctx, tx, identity, "")
		if err != nil {
			return err
		}
		for _, g := range gs {
			if g.State == Live {
				live[g.Projection] = g
			}
		}
		return nil
	})
	return live, err
}

const opColumns = `id, identity, projection, kind, generation, from_generation, state, allow_partial_history,
	coalesce(deleted_records, '[]'::jsonb), actor, error_code, error_message, waiting, records_done, records_remaining,
	rate, arrival_rate, created_at, started_at, cutover_at, finished_at, updated_at, retain_seconds,
	os_user, db_user, cancelled_by, cancelled_os_user, cancelled_db_user`

func scanOperation(r pgx.CollectableRow) (Operation, error) {
	var o Operation
	var id uuid.UUID
	var code, msg string
	err := r.Scan(&id, &o.Identity, &o.Projection, &o.Kind, &o.Generation, &o.FromGeneration, &o.State,
		&o.AllowPartialHistory, &o.DeletedRecords, &o.Actor, &code, &msg, &o.Waiting, &o.RecordsDone, &o.RecordsRemaining,
		&o.Rate, &o.ArrivalRate, &o.CreatedAt, &o.StartedAt, &o.CutoverAt, &o.FinishedAt, &o.UpdatedAt, &o.RetainSeconds,
		&o.OSUser, &o.DBUser, &o.CancelledBy, &o.CancelledByOSUser, &o.CancelledByDBUser)
	o.ID = id.String()
	if code != "" {
		o.Error = &Error{Code: code, Message: msg}
	}
	if len(o.DeletedRecords) == 0 {
		o.DeletedRecords = nil
	}
	o.fillETA()
	return o, err
}

// Operation returns the operation id; ok is false when there is none.
func (s *Store) Operation(ctx context.Context, id string) (op Operation, ok bool, err error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return Operation{}, false, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+opColumns+` FROM projector_rebuilds WHERE id = $1`, u)
	if err != nil {
		return Operation{}, false, fmt.Errorf("read operation %s: %w", id, err)
	}
	ops, err := pgx.CollectRows(rows, scanOperation)
	if err != nil {
		return Operation{}, false, fmt.Errorf("read operation %s: %w", id, err)
	}
	if len(ops) == 0 {
		return Operation{}, false, nil
	}
	return ops[0], true, nil
}

// Operations lists identity's operations, newest first ("" lists every
// identity's); with active, only those in flight.
func (s *Store) Operations(ctx context.Context, identity string, active bool) ([]Operation, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+opColumns+` FROM projector_rebuilds
		WHERE ($1 = '' OR identity = $1) AND (NOT $2 OR state IN ('accepted', 'running', 'cutting_over'))
		ORDER BY created_at DESC, id`, identity, active)
	if err != nil {
		return nil, fmt.Errorf("list operations: %w", err)
	}
	ops, err := pgx.CollectRows(rows, scanOperation)
	if err != nil {
		return nil, fmt.Errorf("list operations: %w", err)
	}
	return ops, nil
}

// Request asks for a rebuild.
type Request struct {
	Identity   string
	Projection string
	// Definition of the new generation; nil: the live generation's (a
	// rebuild after a fold bug was fixed in code).
	Definition *projection.Definition
	// AllowPartialHistory starts the rebuild even where retention
	// deleted records it would need (recorded in the operation).
	AllowPartialHistory bool
	Actor               string
	// Retain is how long the generation it replaces is kept, retired,
	// for a rollback (0: DefaultRetain).
	Retain time.Duration
}

// physicalName is the table of generation n of the projection writing
// table: "<table>__g<n>" (in table's schema when qualified).
func physicalName(table string, n int) string { return fmt.Sprintf("%s__g%d", table, n) }

func retiredName(physical string) string { return physical + "_retired" }

// RetiredTable is the table a retired generation's rows are kept in until
// it is dropped.
func (g Generation) RetiredTable() string { return retiredName(g.PhysicalTable) }

// GroupID is the consumer identity of generation n (n ≥ 2) of a
// projection.
func GroupID(identity, projectionName string, n int) string {
	return fmt.Sprintf("%s.%s.g%d", identity, projectionName, n)
}

// checkNameLength refuses a table name whose retired form Postgres would
// truncate (identifiers are at most 63 bytes).
func checkNameLength(table string, n int) error {
	name := retiredName(physicalName(table, n))
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	if len(name) > 63 {
		return errorf(CodeTableTooLong, "table %s: a generation's retired table would be named %s, %d bytes: Postgres allows 63; choose a shorter table name", table, name, len(name))
	}
	return nil
}

// Start records a rebuild of r.Projection as an accepted operation with
// its new generation (building). A second start while one is in flight
// fails with an *Error of code CodeInFlight naming it.
func (s *Store) Start(ctx context.Context, r Request) (Operation, error) {
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Serialise starts of the projection: the in-flight index
		// catches the race too, but this names the operation in flight.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`, r.Identity, r.Projection); err != nil {
			return fmt.Errorf("lock projection %s: %w", r.Projection, err)
		}
		if err := inFlight(ctx, tx, r.Identity, r.Projection); err != nil {
			return err
		}
		gs, err := generations(ctx, tx, r.Identity, r.Projection)
		if err != nil {
			return err
		}
		var live *Generation
		last := 0
		for i := range gs {
			if gs[i].State == Live {
				live = &gs[i]
			}
		}
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(generation), 0) FROM projector_generations WHERE identity = $1 AND projection = $2`,
			r.Identity, r.Projection).Scan(&last); err != nil {
			return fmt.Errorf("read generations of %s: %w", r.Projection, err)
		}
		if live == nil {
			return errorf(CodeUnknown, "projection %s of identity %s has no live generation: start projector run with it once before rebuilding it", r.Projection, r.Identity)
		}
		def := live.Definition
		if r.Definition != nil {
			def = *r.Definition
		}
		p, err := def.Compile(nil)
		if err != nil {
			return errorf(CodeBadDefinition, "projection %s: the new definition: %v", r.Projection, err)
		}
		if p.Name != r.Projection {
			return errorf(CodeBadDefinition, "the definition is of projection %s, not %s: a rebuild keeps the projection's name", p.Name, r.Projection)
		}
		if p.Table != live.Table {
			return errorf(CodeBadDefinition, "projection %s: the definition names table %s, the live generation %s: a rebuild keeps the table name readers use (rename it in a new projection instead)", r.Projection, p.Table, live.Table)
		}
		n := last + 1
		if err := checkNameLength(live.Table, n); err != nil {
			return err
		}
		id = uuid.New()
		if _, err := tx.Exec(ctx, `INSERT INTO projector_generations
			(identity, projection, generation, state, table_name, physical_table, group_id, definition, reader_schema, definition_hash)
			VALUES ($1, $2, $3, 'building', $4, $5, $6, $7, $8, $9)`,
			r.Identity, r.Projection, n, live.Table, physicalName(live.Table, n), GroupID(r.Identity, r.Projection, n),
			string(def.YAML), def.Schema, def.Hash()); err != nil {
			return fmt.Errorf("record generation %d of %s: %w", n, r.Projection, err)
		}
		retain := r.Retain
		if retain <= 0 {
			retain = DefaultRetain
		}
		if _, err := tx.Exec(ctx, `INSERT INTO projector_rebuilds (id, identity, projection, kind, generation, from_generation, state, allow_partial_history, actor, retain_seconds, os_user, db_user)
			VALUES ($1, $2, $3, 'rebuild', $4, $5, 'accepted', $6, $7, $8, $9, session_user)`,
			id, r.Identity, r.Projection, n, live.N, r.AllowPartialHistory, r.Actor, int64(retain.Seconds()), s.osUser); err != nil {
			return fmt.Errorf("record the rebuild of %s: %w", r.Projection, err)
		}
		return nil
	})
	if err != nil {
		return Operation{}, inFlightRace(ctx, s, r.Identity, r.Projection, err)
	}
	op, _, err := s.Operation(ctx, id.String())
	return op, err
}

// Rollback records an operation that makes the newest retired generation
// of the projection live again: its engine resumes from its own stored
// offsets, catches up and cuts over as a rebuild does.
func (s *Store) Rollback(ctx context.Context, identity, projectionName, actor string) (Operation, error) {
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`, identity, projectionName); err != nil {
			return fmt.Errorf("lock projection %s: %w", projectionName, err)
		}
		if err := inFlight(ctx, tx, identity, projectionName); err != nil {
			return err
		}
		gs, err := generations(ctx, tx, identity, projectionName)
		if err != nil {
			return err
		}
		var live, back *Generation
		for i := range gs {
			switch gs[i].State {
			case Live:
				live = &gs[i]
			case Retired:
				if back == nil || gs[i].N > back.N {
					back = &gs[i]
				}
			}
		}
		if live == nil {
			return errorf(CodeUnknown, "projection %s of identity %s has no live generation", projectionName, identity)
		}
		if back == nil {
			return errorf(CodeNothingRetired, "projection %s has no retired generation to make live again (retired generations are dropped after their retention, or by rebuild cleanup)", projectionName)
		}
		id = uuid.New()
		if _, err := tx.Exec(ctx, `INSERT INTO projector_rebuilds (id, identity, projection, kind, generation, from_generation, state, actor, os_user, db_user)
			VALUES ($1, $2, $3, 'rollback', $4, $5, 'accepted', $6, $7, session_user)`, id, identity, projectionName, back.N, live.N, actor, s.osUser); err != nil {
			return fmt.Errorf("record the rollback of %s: %w", projectionName, err)
		}
		return nil
	})
	if err != nil {
		return Operation{}, inFlightRace(ctx, s, identity, projectionName, err)
	}
	op, _, err := s.Operation(ctx, id.String())
	return op, err
}

func inFlight(ctx context.Context, q querier, identity, projectionName string) error {
	var id uuid.UUID
	var state string
	err := q.QueryRow(ctx, `SELECT id, state FROM projector_rebuilds
		WHERE identity = $1 AND projection = $2 AND state IN ('accepted', 'running', 'cutting_over')`, identity, projectionName).Scan(&id, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look for operations of %s in flight: %w", projectionName, err)
	}
	return errorf(CodeInFlight, "projection %s already has operation %s in flight (%s): cancel it or wait for it to end", projectionName, id, state)
}

// inFlightRace turns a unique violation of the in-flight index (a start
// racing another) into CodeInFlight.
func inFlightRace(ctx context.Context, s *Store, identity, projectionName string, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" {
		if e := inFlight(ctx, s.pool, identity, projectionName); e != nil {
			return e
		}
	}
	return err
}

// Cancel moves an accepted or running operation to cancelled. Once it is
// cutting over or has ended, it fails with CodeCutoverLost or says how it
// ended: the cutover and the cancel each change the state only from the
// one they saw, so exactly one wins.
func (s *Store) Cancel(ctx context.Context, id, actor string) (Operation, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return Operation{}, errorf("not_found", "no operation %s", id)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE projector_rebuilds SET state = 'cancelled', finished_at = now(), updated_at = now(),
		error_code = 'cancelled', error_message = 'cancelled by ' || $2, waiting = '',
		cancelled_by = $2, cancelled_os_user = $3, cancelled_db_user = session_user
		WHERE id = $1 AND state IN ('accepted', 'running')`, u, nonEmpty(actor, "an operator"), s.osUser)
	if err != nil {
		return Operation{}, fmt.Errorf("cancel operation %s: %w", id, err)
	}
	op, ok, err := s.Operation(ctx, id)
	if err != nil {
		return Operation{}, err
	}
	if !ok {
		return Operation{}, errorf("not_found", "no operation %s", id)
	}
	if tag.RowsAffected() == 0 {
		if op.State == StateCuttingOver || op.State == StateCompleted {
			return op, errorf(CodeCutoverLost, "operation %s is %s: the cutover began before the cancel; roll back instead once it completes", id, op.State)
		}
		return op, errorf("already_ended", "operation %s already ended: %s", id, op.State)
	}
	if op.Kind == KindRebuild {
		// The new generation will never be live: the supervisors drop
		// its table, offsets and group.
		if _, err := s.pool.Exec(ctx, `UPDATE projector_generations SET state = 'cancelled'
			WHERE identity = $1 AND projection = $2 AND generation = $3 AND state = 'building'`, op.Identity, op.Projection, op.Generation); err != nil {
			return op, fmt.Errorf("cancel generation %d of %s: %w", op.Generation, op.Projection, err)
		}
	} else {
		if _, err := s.pool.Exec(ctx, `UPDATE projector_generations SET state = 'retired'
			WHERE identity = $1 AND projection = $2 AND generation = $3 AND state = 'building'`, op.Identity, op.Projection, op.Generation); err != nil {
			return op, fmt.Errorf("cancel the rollback to generation %d of %s: %w", op.Generation, op.Projection, err)
		}
	}
	return op, nil
}

func nonEmpty(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// offsets returns the stored next offsets of identity on topic, by
// partition.
func (s *Store) offsets(ctx context.Context, identity, topic string) (map[int32]int64, error) {
	return offsets(ctx, s.pool, identity, topic)
}

func offsets(ctx context.Context, q querier, identity, topic string) (map[int32]int64, error) {
	rows, err := q.Query(ctx, `SELECT partition, next_offset FROM projector_offsets WHERE identity = $1 AND topic = $2 AND next_offset IS NOT NULL`, identity, topic)
	if err != nil {
		return nil, fmt.Errorf("read the offsets of %s: %w", identity, err)
	}
	out := map[int32]int64{}
	var p int32
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { out[p] = n; return nil }); err != nil {
		return nil, fmt.Errorf("read the offsets of %s: %w", identity, err)
	}
	return out, nil
}
