package deadletters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/sinks"
)

// Dead-letter statuses (projector_dead_letters.status).
const (
	// StatusOpen: waiting for an operator (the initial status, and the
	// status again when a replayed record fails once more).
	StatusOpen = "open"
	// StatusReplayed: produced again to its topic; not yet seen applied.
	StatusReplayed = "replayed"
	// StatusResolved: the replayed record applied (or was already
	// applied), or an operator settled it.
	StatusResolved = "resolved"
	// StatusPurged: never to be replayed.
	StatusPurged = "purged"
)

// Statuses lists every dead-letter status.
var Statuses = []string{StatusOpen, StatusQueued, StatusReplayed, StatusResolved, StatusPurged}

// ErrNoDeadLetter reports a dead-letter id that does not exist.
var ErrNoDeadLetter = errors.New("no such dead letter")

// Entry is one stored dead letter.
type Entry struct {
	ID         int64  `json:"id"`
	Identity   string `json:"identity"`
	Projection string `json:"projection"`
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
	Offset     int64  `json:"offset"`
	// Key is the record key ("" for a record without one; see KeyNull).
	Key string `json:"key"`
	// KeyNull reports a record without a key (a null key, as opposed to
	// an empty one).
	KeyNull bool `json:"key_null,omitempty"`
	// Value is the record value, nil for a record without one.
	Value      []byte         `json:"value"`
	Headers    []sinks.Header `json:"headers"`
	RecordTime *time.Time     `json:"record_time,omitempty"`
	Error      string         `json:"error"`
	ErrorClass string         `json:"error_class"`
	SchemaID   *int           `json:"schema_id,omitempty"`
	TraceID    string         `json:"trace_id,omitempty"`
	Status     string         `json:"status"`
	Attempts   int            `json:"attempts"`
	Replays    int            `json:"replays"`
	FirstSeen  time.Time      `json:"first_seen"`
	LastSeen   time.Time      `json:"last_seen"`
	ReplayedAt *time.Time     `json:"replayed_at,omitempty"`
	ResolvedAt *time.Time     `json:"resolved_at,omitempty"`
}

// RecordKey is the record key as produced: nil for a record without one.
func (d Entry) RecordKey() []byte {
	if d.KeyNull {
		return nil
	}
	return []byte(d.Key)
}

// Filter narrows the dead letters a function looks at; zero
// fields match everything. The JSON form is what the audit log records.
type Filter struct {
	// IDs, when not nil, keeps only these ids; an empty non-nil slice
	// matches nothing.
	IDs        []int64   `json:"ids,omitempty"`
	Identity   string    `json:"identity,omitempty"`
	Projection string    `json:"projection,omitempty"`
	Topic      string    `json:"topic,omitempty"`
	Key        string    `json:"key,omitempty"`         // the record key, exactly
	ErrorClass string    `json:"error_class,omitempty"` // e.g. decode
	Status     string    `json:"status,omitempty"`      // one of Statuses; "": any
	Since      time.Time `json:"since,omitzero"`        // first_seen at or after
	Until      time.Time `json:"until,omitzero"`        // first_seen before
	// AfterID keeps the entries of a higher id: the next page of a list
	// in id order.
	AfterID int64 `json:"after_id,omitempty"`
	// Limit caps how many entries are returned or purged, oldest first.
	// List uses 1000 when it is not positive; the other
	// functions then have no cap.
	Limit int `json:"limit,omitempty"`
}

// ValidStatus reports whether s is a dead-letter status.
func ValidStatus(s string) bool {
	for _, v := range Statuses {
		if s == v {
			return true
		}
	}
	return false
}

// where returns the filter's WHERE clause (without the keyword) and its
// arguments, numbered from $1.
func (f Filter) where() (string, []any, error) {
	var (
		conds []string
		args  []any
	)
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if f.IDs != nil {
		add("id = ANY($%d::bigint[])", f.IDs)
	}
	if f.Identity != "" {
		add("identity = $%d", f.Identity)
	}
	if f.Projection != "" {
		add("projection = $%d", f.Projection)
	}
	if f.Topic != "" {
		add("topic = $%d", f.Topic)
	}
	if f.Key != "" {
		add("record_key = $%d::bytea", []byte(f.Key))
	}
	if f.ErrorClass != "" {
		add("error_class = $%d", f.ErrorClass)
	}
	if f.Status != "" {
		if !ValidStatus(f.Status) {
			return "", nil, fmt.Errorf("status %q: want one of %s", f.Status, strings.Join(Statuses, ", "))
		}
		add("status = $%d", f.Status)
	}
	if !f.Since.IsZero() {
		add("first_seen >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		add("first_seen < $%d", f.Until)
	}
	if f.AfterID > 0 {
		add("id > $%d", f.AfterID)
	}
	if len(conds) == 0 {
		return "true", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

const deadLetterColumns = `id, identity, projection, topic, partition, "offset", record_key, value,
	headers, record_time, error, error_class, schema_id, coalesce(trace_id, ''), status, attempts, replays,
	first_seen, last_seen, replayed_at, resolved_at`

func scanEntry(r pgx.CollectableRow) (Entry, error) {
	var (
		d       Entry
		key     []byte
		headers []byte
	)
	if err := r.Scan(&d.ID, &d.Identity, &d.Projection, &d.Topic, &d.Partition, &d.Offset, &key, &d.Value,
		&headers, &d.RecordTime, &d.Error, &d.ErrorClass, &d.SchemaID, &d.TraceID, &d.Status, &d.Attempts, &d.Replays,
		&d.FirstSeen, &d.LastSeen, &d.ReplayedAt, &d.ResolvedAt); err != nil {
		return d, err
	}
	d.Key, d.KeyNull = string(key), key == nil
	if err := json.Unmarshal(headers, &d.Headers); err != nil {
		return d, fmt.Errorf("dead letter %d: headers: %w", d.ID, err)
	}
	return d, nil
}

// List returns the dead letters matching f, oldest first.
func List(ctx context.Context, pool *pgxpool.Pool, f Filter) ([]Entry, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	where, args, err := f.where()
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	args = append(args, f.Limit)
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT %s FROM projector_dead_letters WHERE %s ORDER BY id LIMIT $%d`,
		deadLetterColumns, where, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// IDs returns the ids of the dead letters matching f, oldest
// first, without loading the records; f.Limit caps them when positive.
func IDs(ctx context.Context, pool *pgxpool.Pool, f Filter) ([]int64, error) {
	where, args, err := f.where()
	if err != nil {
		return nil, fmt.Errorf("list dead-letter ids: %w", err)
	}
	q := fmt.Sprintf(`SELECT id FROM projector_dead_letters WHERE %s ORDER BY id`, where)
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q += fmt.Sprintf(" LIMIT $%d", len(args))
	}
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list dead-letter ids: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list dead-letter ids: %w", err)
	}
	return ids, nil
}

// Count counts the dead letters matching f (f.Limit aside).
func Count(ctx context.Context, pool *pgxpool.Pool, f Filter) (int64, error) {
	where, args, err := f.where()
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_dead_letters WHERE `+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// Get returns one dead letter; the error wraps ErrNoDeadLetter
// when there is none with that id.
func Get(ctx context.Context, pool *pgxpool.Pool, id int64) (Entry, error) {
	rows, err := pool.Query(ctx, `SELECT `+deadLetterColumns+` FROM projector_dead_letters WHERE id = $1`, id)
	if err != nil {
		return Entry{}, fmt.Errorf("dead letter %d: %w", id, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanEntry)
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("dead letter %d: %w", id, err)
	}
	return d, nil
}

// MarkReplayed records that the dead letters ids are produced again:
// status replayed, one more replay, replayed_at now. Purged entries are
// left alone. Call it before producing them (see UnmarkReplayed).
func MarkReplayed(ctx context.Context, pool *pgxpool.Pool, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := pool.Exec(ctx, `UPDATE projector_dead_letters
		SET status = 'replayed', replays = replays + 1, replayed_at = now()
		WHERE id = ANY($1::bigint[]) AND status <> 'purged'`, ids)
	if err != nil {
		return fmt.Errorf("mark dead letters replayed: %w", err)
	}
	return nil
}

// UnmarkReplayed undoes MarkReplayed of one entry whose record was not
// produced after all, giving it back status (its status before), unless
// something changed it since.
func UnmarkReplayed(ctx context.Context, pool *pgxpool.Pool, id int64, status string) error {
	_, err := pool.Exec(ctx, `UPDATE projector_dead_letters
		SET status = $2, replays = greatest(replays - 1, 0)
		WHERE id = $1 AND status = 'replayed'`, id, status)
	if err != nil {
		return fmt.Errorf("mark dead letter %d as before its replay: %w", id, err)
	}
	return nil
}

// Purge deletes the dead letters matching f (f.Limit, when
// positive, caps them, oldest first) and returns how many it deleted.
// Their rows waiting in the dead-letter topic outbox go with them.
func Purge(ctx context.Context, pool *pgxpool.Pool, f Filter) (int64, error) {
	where, args, err := f.where()
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	q := fmt.Sprintf(`DELETE FROM projector_dead_letters WHERE %s`, where)
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q = fmt.Sprintf(`DELETE FROM projector_dead_letters WHERE id IN (
			SELECT id FROM projector_dead_letters WHERE %s ORDER BY id LIMIT $%d)`, where, len(args))
	}
	tag, err := pool.Exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Audit actions.
const (
	AuditReplay = "replay"
	AuditPurge  = "purge"
)

// AuditEntry is one row of the dead-letter audit log.
type AuditEntry struct {
	ID    int64     `json:"id"`
	At    time.Time `json:"at"`
	Actor string    `json:"actor"`
	// OSUser is the operating-system user of the command that did it
	// ("" for an action through the API, or written by an earlier
	// release); DBUser the database session user of its transaction.
	OSUser   string          `json:"os_user"`
	DBUser   string          `json:"db_user"`
	Action   string          `json:"action"`
	Filter   json.RawMessage `json:"filter"`
	EntryIDs []int64         `json:"entry_ids"`
	Detail   string          `json:"detail"`
}

// Audit records that actor did action (AuditReplay, AuditPurge) to the
// dead letters ids, selected by filter (stored as JSON; nil: {}). See
// AuditAs, which records the operating-system user too.
func Audit(ctx context.Context, pool *pgxpool.Pool, actor, action string, filter any, ids []int64, detail string) error {
	return AuditAs(ctx, pool, Actor{Name: actor}, action, filter, ids, detail)
}

// ListAudit returns the newest limit audit entries (all when limit is not
// positive), newest first.
func ListAudit(ctx context.Context, pool *pgxpool.Pool, limit int) ([]AuditEntry, error) {
	q := `SELECT id, at, actor, os_user, db_user, action, filter, entry_ids, detail FROM projector_dlq_audit ORDER BY id DESC`
	var args []any
	if limit > 0 {
		q += ` LIMIT $1`
		args = append(args, limit)
	}
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list dead-letter audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var (
			a      AuditEntry
			filter []byte
		)
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.OSUser, &a.DBUser, &a.Action, &filter, &a.EntryIDs, &a.Detail)
		a.Filter = filter
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead-letter audit: %w", err)
	}
	return out, nil
}

// Depth counts the open dead letters of each projection that
// has any, for one identity ("" for all).
func Depth(ctx context.Context, pool *pgxpool.Pool, identity string) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT projection, count(*) FROM projector_dead_letters
		WHERE status = 'open' AND ($1 = '' OR identity = $1) GROUP BY projection`, identity)
	if err != nil {
		return nil, fmt.Errorf("count open dead letters: %w", err)
	}
	out := map[string]int64{}
	var (
		name string
		n    int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
		out[name] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count open dead letters: %w", err)
	}
	return out, nil
}
