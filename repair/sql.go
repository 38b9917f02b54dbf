package repair

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/projection"
)

// SQLConfig configures a SQL repair source.
type SQLConfig struct {
	// Query is run with $1 = the aggregate id (text) and $2 = the missing
	// version (bigint); a query may leave $2 out. Its result columns decide
	// what it returns:
	//
	//   - version, state: a snapshot; the row with the highest version is
	//     taken. state is json, jsonb or text holding a JSON object.
	//   - version, type, fields: events, in any order; those before the
	//     missing version are ignored, the rest must start at it with no
	//     holes. fields is json, jsonb or text holding a JSON object, or
	//     NULL for a tombstone; a NULL type is "".
	//
	// No rows is ErrNotFound. The query runs in a read-only transaction:
	// one that writes fails.
	Query string
}

// SQL is a repair source that reads an aggregate's state or its missing
// events from Postgres with a query.
type SQL struct {
	pool  *pgxpool.Pool
	query string
}

// NewSQL checks cfg and returns a SQL repair source reading through pool.
func NewSQL(pool *pgxpool.Pool, cfg SQLConfig) (*SQL, error) {
	if pool == nil {
		return nil, errors.New("sql repair source: pool is nil")
	}
	if strings.TrimSpace(cfg.Query) == "" {
		return nil, errors.New("sql repair source: query is required")
	}
	return &SQL{pool: pool, query: cfg.Query}, nil
}

var (
	snapshotColumns = []string{"state", "version"}
	eventColumns    = []string{"fields", "type", "version"}
)

// Repair runs the query for key and missing.
func (s *SQL) Repair(ctx context.Context, key string, missing int64) (Result, error) {
	res, err := s.repair(ctx, key, missing)
	if err != nil {
		return Result{}, fmt.Errorf("repair %q from version %d: sql: %w", key, missing, err)
	}
	return res, nil
}

func (s *SQL) repair(ctx context.Context, key string, missing int64) (Result, error) {
	if err := checkMissing(missing); err != nil {
		return Result{}, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Result{}, &acquireError{err}
	}
	defer conn.Release()
	// A repair source only reads: the query runs in a read-only
	// transaction, so a query that writes (a data-modifying WITH, a
	// function with side effects) fails instead of changing the source.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return Result{}, fmt.Errorf("begin read-only transaction: %w", err)
	}
	defer func() {
		// Read-only: nothing to keep. The rollback gets a context of its
		// own, so that one cut short by ctx still ends the transaction.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()

	// Describe the query first: its columns decide the shape, its
	// parameters how many arguments it takes.
	sd, err := tx.Prepare(ctx, "", s.query)
	if err != nil {
		return Result{}, fmt.Errorf("describe query: %w", err)
	}
	args := []any{key, missing}
	n := len(sd.ParamOIDs)
	if n > len(args) {
		return Result{}, fmt.Errorf("query has %d parameters, want $1 (key) and optionally $2 (missing version)", n)
	}
	args = args[:n]
	cols := map[string]int{}
	names := make([]string, len(sd.Fields))
	for i, f := range sd.Fields {
		if _, dup := cols[f.Name]; dup {
			return Result{}, fmt.Errorf("query returns column %q twice", f.Name)
		}
		cols[f.Name] = i
		names[i] = f.Name
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	var jsonCol string
	switch {
	case slices.Equal(sorted, snapshotColumns):
		jsonCol = "state"
	case slices.Equal(sorted, eventColumns):
		jsonCol = "fields"
	default:
		return Result{}, fmt.Errorf("query returns columns (%s): want (version, state) for a snapshot or (version, type, fields) for events", strings.Join(names, ", "))
	}
	colType := func(name string) uint32 { return sd.Fields[cols[name]].DataTypeOID }
	if oid := colType("version"); !slices.Contains(versionTypes, oid) {
		return Result{}, fmt.Errorf("column version is %s: want bigint, integer, smallint or numeric", typeName(conn.Conn().TypeMap(), oid))
	}
	if oid := colType(jsonCol); !slices.Contains(jsonTypes, oid) {
		return Result{}, fmt.Errorf("column %s is %s: want json, jsonb or text", jsonCol, typeName(conn.Conn().TypeMap(), oid))
	}
	if jsonCol == "fields" {
		if oid := colType("type"); !slices.Contains(textTypes, oid) {
			return Result{}, fmt.Errorf("column type is %s: want text", typeName(conn.Conn().TypeMap(), oid))
		}
	}

	rows, err := tx.Query(ctx, s.query, args...)
	if err != nil {
		return Result{}, err
	}
	defer rows.Close()
	var (
		version = versionDest{numeric: colType("version") == pgtype.NumericOID}
		text    *string
		typ     *string
	)
	dest := make([]any, len(names))
	dest[cols["version"]] = version.dest()
	dest[cols[jsonCol]] = &text
	if jsonCol == "state" {
		return snapshot(rows, dest, missing, &version, &text)
	}
	dest[cols["type"]] = &typ
	var events []projection.Event
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return Result{}, err
		}
		v, err := version.value()
		if err != nil {
			return Result{}, err
		}
		ev := projection.Event{Version: v}
		if typ != nil {
			ev.Type = *typ
		}
		if text != nil {
			if ev.Fields, err = decodeFields([]byte(*text)); err != nil {
				return Result{}, fmt.Errorf("version %d: fields: %v", v, err)
			}
		}
		events = append(events, ev)
	}
	if err := rows.Err(); err != nil {
		return Result{}, err
	}
	return eventsResult(key, missing, events)
}

// snapshot takes the row with the highest version.
func snapshot(rows pgx.Rows, dest []any, missing int64, version *versionDest, state **string) (Result, error) {
	var (
		found     bool
		best      int64
		bestState *string // a copy: Scan may reuse what *state points to
	)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return Result{}, err
		}
		v, err := version.value()
		if err != nil {
			return Result{}, err
		}
		switch {
		case !found || v > best:
			found, best, bestState = true, v, copyText(*state)
		case v == best && !equalText(bestState, *state):
			return Result{}, fmt.Errorf("two rows have version %d with different states", v)
		}
	}
	if err := rows.Err(); err != nil {
		return Result{}, err
	}
	if !found {
		return Result{}, ErrNotFound
	}
	if bestState == nil {
		return Result{}, fmt.Errorf("version %d: state is NULL", best)
	}
	row, err := decodeState([]byte(*bestState))
	if err != nil {
		return Result{}, fmt.Errorf("version %d: state: %v", best, err)
	}
	return snapshotResult(missing, best, row)
}

// versionDest scans the version column: an integer, or a numeric holding
// one.
type versionDest struct {
	numeric bool
	i       pgtype.Int8
	n       pgtype.Numeric
}

func (d *versionDest) dest() any {
	if d.numeric {
		return &d.n
	}
	return &d.i
}

func (d *versionDest) value() (int64, error) {
	if !d.numeric {
		if !d.i.Valid {
			return 0, errors.New("a row has a NULL version")
		}
		return d.i.Int64, nil
	}
	if !d.n.Valid {
		return 0, errors.New("a row has a NULL version")
	}
	i, err := d.n.Int64Value()
	if err != nil || !i.Valid {
		f, _ := d.n.Float64Value()
		return 0, fmt.Errorf("a row has version %v: want an integer", f.Float64)
	}
	return i.Int64, nil
}

func copyText(s *string) *string {
	if s == nil {
		return nil
	}
	c := *s
	return &c
}

func equalText(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Column types accepted, by OID.
var (
	versionTypes = []uint32{pgtype.Int8OID, pgtype.Int4OID, pgtype.Int2OID, pgtype.NumericOID}
	textTypes    = []uint32{pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID, pgtype.UnknownOID}
	jsonTypes    = append([]uint32{pgtype.JSONOID, pgtype.JSONBOID}, textTypes...)
)

func typeName(m *pgtype.Map, oid uint32) string {
	if t, ok := m.TypeForOID(oid); ok {
		return t.Name
	}
	return fmt.Sprintf("type oid %d", oid)
}

var (
	_ Repairer = (*SQL)(nil)
	_ Repairer = (*HTTP)(nil)
)
