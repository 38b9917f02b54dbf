package deadletters_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// dlRow is a dead letter as the tests insert it.
type dlRow struct {
	identity, projection, topic string
	offset                      int64
	key                         []byte // nil: a record without a key
	value                       []byte
	class, status               string
	firstSeen                   time.Time
}

func dlDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db := testenv.NewDB(t)
	if err := postgres.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return db.Pool
}

func dlInsert(t *testing.T, pool *pgxpool.Pool, r dlRow) int64 {
	t.Helper()
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&r.identity, "ident")
	def(&r.projection, "accounts")
	def(&r.topic, "accounts.events")
	def(&r.class, "decode")
	def(&r.status, "open")
	if r.firstSeen.IsZero() {
		r.firstSeen = time.Now()
	}
	var id int64
	err := pool.QueryRow(t.Context(), `INSERT INTO projector_dead_letters
		(identity, projection, topic, partition, "offset", record_key, value, error, error_class, status, first_seen, last_seen)
		VALUES ($1, $2, $3, 0, $4, $5, $6, 'boom', $7, $8, $9, $9) RETURNING id`,
		r.identity, r.projection, r.topic, r.offset, r.key, r.value, r.class, r.status, r.firstSeen).Scan(&id)
	if err != nil {
		t.Fatalf("insert dead letter: %v", err)
	}
	return id
}

func dlIDs(ds []deadletters.Entry) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func TestDeadLetterFilters(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	now := time.Now()
	day := 24 * time.Hour
	a := dlInsert(t, pool, dlRow{offset: 1, key: []byte("acc-1"), firstSeen: now.Add(-3 * day)})
	b := dlInsert(t, pool, dlRow{offset: 2, key: []byte("acc-2"), class: "fold", status: "replayed", firstSeen: now.Add(-2 * day)})
	c := dlInsert(t, pool, dlRow{offset: 3, key: []byte("acc-1"), projection: "other", topic: "other.events", firstSeen: now.Add(-day)})
	d := dlInsert(t, pool, dlRow{offset: 4, identity: "second", class: "gap", status: "resolved", firstSeen: now})
	e := dlInsert(t, pool, dlRow{offset: 5, key: []byte("acc-3"), status: "purged", firstSeen: now})

	for _, tc := range []struct {
		name string
		f    deadletters.Filter
		want []int64
	}{
		{"all", deadletters.Filter{}, []int64{a, b, c, d, e}},
		{"identity", deadletters.Filter{Identity: "second"}, []int64{d}},
		{"projection", deadletters.Filter{Projection: "accounts"}, []int64{a, b, d, e}},
		{"topic", deadletters.Filter{Topic: "other.events"}, []int64{c}},
		{"key", deadletters.Filter{Key: "acc-1"}, []int64{a, c}},
		{"error class", deadletters.Filter{ErrorClass: "fold"}, []int64{b}},
		{"status open", deadletters.Filter{Status: "open"}, []int64{a, c}},
		{"status purged", deadletters.Filter{Status: "purged"}, []int64{e}},
		{"since", deadletters.Filter{Since: now.Add(-36 * time.Hour)}, []int64{c, d, e}},
		{"until", deadletters.Filter{Until: now.Add(-36 * time.Hour)}, []int64{a, b}},
		{"range", deadletters.Filter{Since: now.Add(-60 * time.Hour), Until: now.Add(-time.Hour)}, []int64{b, c}},
		{"ids", deadletters.Filter{IDs: []int64{e, a, 999999}}, []int64{a, e}},
		{"empty ids match nothing", deadletters.Filter{IDs: []int64{}}, []int64{}},
		{"combined", deadletters.Filter{Projection: "accounts", Status: "open", Key: "acc-1"}, []int64{a}},
		{"limit", deadletters.Filter{Limit: 2}, []int64{a, b}},
		{"no match", deadletters.Filter{Key: "nope"}, []int64{}},
	} {
		got, err := deadletters.List(ctx, pool, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(dlIDs(got), tc.want) {
			t.Errorf("%s: List = %v, want %v", tc.name, dlIDs(got), tc.want)
		}
		ids, err := deadletters.IDs(ctx, pool, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(ids, tc.want) && !(len(ids) == 0 && len(tc.want) == 0) {
			t.Errorf("%s: IDs = %v, want %v", tc.name, ids, tc.want)
		}
		if tc.f.Limit == 0 {
			if n, err := deadletters.Count(ctx, pool, tc.f); err != nil || n != int64(len(tc.want)) {
				t.Errorf("%s: Count = %d, %v; want %d", tc.name, n, err, len(tc.want))
			}
		}
	}
	if _, err := deadletters.List(ctx, pool, deadletters.Filter{Status: "closed"}); err == nil {
		t.Error("List accepted status closed")
	}
}

func TestGetDeadLetterReturnsEveryField(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	headers := []sinks.Header{{Key: "traceparent", Value: []byte("00-abc-def-01")}, {Key: "bin", Value: []byte{0xff, 0}}}
	hs, _ := json.Marshal(headers)
	var id int64
	err := pool.QueryRow(ctx, `INSERT INTO projector_dead_letters
		(identity, projection, topic, partition, "offset", record_key, value, headers, record_time, error, attempts,
		 error_class, schema_id, trace_id, status, replays, replayed_at, resolved_at)
		VALUES ('ident', 'accounts', 'accounts.events', 3, 42, 'acc-7', '\x000102', $1::jsonb, $2, 'boom', 2,
		 'fold', 17, 'abc', 'resolved', 1, $2, $2) RETURNING id`, string(hs), at).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	d, err := deadletters.Get(ctx, pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != id || d.Identity != "ident" || d.Projection != "accounts" || d.Topic != "accounts.events" || d.Partition != 3 ||
		d.Offset != 42 || d.Key != "acc-7" || d.KeyNull || !bytes.Equal(d.Value, []byte{0, 1, 2}) || d.Error != "boom" ||
		d.Attempts != 2 || d.ErrorClass != "fold" || d.SchemaID == nil || *d.SchemaID != 17 || d.TraceID != "abc" ||
		d.Status != "resolved" || d.Replays != 1 || d.RecordTime == nil || !d.RecordTime.Equal(at) ||
		d.ReplayedAt == nil || !d.ReplayedAt.Equal(at) || d.ResolvedAt == nil || !d.ResolvedAt.Equal(at) ||
		d.FirstSeen.IsZero() || d.LastSeen.IsZero() {
		t.Errorf("Get = %+v", d)
	}
	if len(d.Headers) != 2 || d.Headers[1].Key != "bin" || !bytes.Equal(d.Headers[1].Value, []byte{0xff, 0}) {
		t.Errorf("headers = %v, want %v", d.Headers, headers)
	}

	// A record without key or value keeps them null.
	bare := dlInsert(t, pool, dlRow{offset: 43})
	d, err = deadletters.Get(ctx, pool, bare)
	if err != nil {
		t.Fatal(err)
	}
	if !d.KeyNull || d.RecordKey() != nil || d.Value != nil || d.SchemaID != nil || d.TraceID != "" || d.Status != "open" {
		t.Errorf("bare dead letter = %+v", d)
	}
	if d, err := deadletters.Get(ctx, pool, dlInsert(t, pool, dlRow{offset: 44, key: []byte{}})); err != nil || d.KeyNull || d.RecordKey() == nil {
		t.Errorf("empty key: KeyNull %v, RecordKey %#v, err %v; want an empty, non-null key", d.KeyNull, d.RecordKey(), err)
	}

	if _, err := deadletters.Get(ctx, pool, 987654); !errors.Is(err, deadletters.ErrNoDeadLetter) {
		t.Errorf("Get(absent) error = %v, want ErrNoDeadLetter", err)
	}
}

func TestMarkReplayed(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	a := dlInsert(t, pool, dlRow{offset: 1})
	b := dlInsert(t, pool, dlRow{offset: 2})
	p := dlInsert(t, pool, dlRow{offset: 3, status: "purged"})
	for round := 1; round <= 2; round++ {
		if err := deadletters.MarkReplayed(ctx, pool, []int64{a, p}); err != nil {
			t.Fatal(err)
		}
		d, _ := deadletters.Get(ctx, pool, a)
		if d.Status != "replayed" || d.Replays != round || d.ReplayedAt == nil {
			t.Errorf("after %d marks: status %s, replays %d, replayed_at %v", round, d.Status, d.Replays, d.ReplayedAt)
		}
	}
	if d, _ := deadletters.Get(ctx, pool, b); d.Status != "open" || d.Replays != 0 || d.ReplayedAt != nil {
		t.Errorf("unmarked entry changed: %+v", d)
	}
	if d, _ := deadletters.Get(ctx, pool, p); d.Status != "purged" || d.Replays != 0 {
		t.Errorf("purged entry marked replayed: %+v", d)
	}
	if err := deadletters.MarkReplayed(ctx, pool, nil); err != nil {
		t.Errorf("MarkReplayed(nil) = %v", err)
	}
}

func TestPurgeDeadLetters(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	a := dlInsert(t, pool, dlRow{offset: 1, class: "fold"})
	_ = dlInsert(t, pool, dlRow{offset: 2, class: "fold"})
	c := dlInsert(t, pool, dlRow{offset: 3, class: "fold"})
	d := dlInsert(t, pool, dlRow{offset: 4, class: "decode"})
	for _, id := range []int64{a, d} {
		if _, err := pool.Exec(ctx, `INSERT INTO projector_dlq_outbox (dead_letter_id, topic) VALUES ($1, 'dlq')`, id); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := deadletters.Purge(ctx, pool, deadletters.Filter{ErrorClass: "fold", Limit: 2}); err != nil || n != 2 {
		t.Fatalf("purge fold, limit 2 = %d, %v; want 2", n, err)
	}
	left, _ := deadletters.List(ctx, pool, deadletters.Filter{})
	if !slices.Equal(dlIDs(left), []int64{c, d}) {
		t.Fatalf("left %v, want %v (the oldest two purged)", dlIDs(left), []int64{c, d})
	}
	var outbox []int64
	rows, _ := pool.Query(ctx, `SELECT dead_letter_id FROM projector_dlq_outbox ORDER BY 1`)
	for rows.Next() {
		var id int64
		_ = rows.Scan(&id)
		outbox = append(outbox, id)
	}
	if rows.Err() != nil || !slices.Equal(outbox, []int64{d}) {
		t.Errorf("outbox holds %v, want %v: the purged entry's row goes with it", outbox, []int64{d})
	}
	if n, err := deadletters.Purge(ctx, pool, deadletters.Filter{IDs: []int64{}}); err != nil || n != 0 {
		t.Errorf("purge with empty IDs = %d, %v; want 0", n, err)
	}
	if n, err := deadletters.Purge(ctx, pool, deadletters.Filter{Status: "bogus"}); err == nil {
		t.Errorf("purge with status bogus = %d, nil; want an error", n)
	}
	if n, err := deadletters.Purge(ctx, pool, deadletters.Filter{}); err != nil || n != 2 {
		t.Errorf("purge all = %d, %v; want 2", n, err)
	}
}

func TestAuditLog(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	f := deadletters.Filter{Projection: "accounts", Status: "open", Since: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	if err := deadletters.Audit(ctx, pool, "alice", deadletters.AuditReplay, f, []int64{3, 4}, "produced 2 of 2"); err != nil {
		t.Fatal(err)
	}
	if err := deadletters.Audit(ctx, pool, "bob", deadletters.AuditPurge, nil, nil, ""); err != nil {
		t.Fatal(err)
	}
	all, err := deadletters.ListAudit(ctx, pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Fatalf("ListAudit = %d entries, want 2", len(all))
	}
	bob, alice := all[0], all[1]
	if bob.Actor != "bob" || bob.Action != "purge" || string(bob.Filter) != "{}" || len(bob.EntryIDs) != 0 {
		t.Errorf("newest entry = %+v", bob)
	}
	if alice.Actor != "alice" || alice.Action != "replay" || !slices.Equal(alice.EntryIDs, []int64{3, 4}) ||
		alice.Detail != "produced 2 of 2" || alice.At.IsZero() {
		t.Errorf("oldest entry = %+v", alice)
	}
	var back deadletters.Filter
	if err := json.Unmarshal(alice.Filter, &back); err != nil || back.Projection != "accounts" || back.Status != "open" || !back.Since.Equal(f.Since) {
		t.Errorf("audited filter %s decodes to %+v (%v)", alice.Filter, back, err)
	}
	if limited, _ := deadletters.ListAudit(ctx, pool, 1); len(limited) != 1 || limited[0].Actor != "bob" {
		t.Errorf("ListAudit(1) = %+v, want the newest entry", limited)
	}
}

func TestDeadLetterDepthByProjection(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	if got, err := deadletters.Depth(ctx, pool, ""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v, %v", got, err)
	}
	dlInsert(t, pool, dlRow{offset: 1})
	dlInsert(t, pool, dlRow{offset: 2})
	dlInsert(t, pool, dlRow{offset: 3, status: "replayed"})
	dlInsert(t, pool, dlRow{offset: 4, projection: "ledger"})
	dlInsert(t, pool, dlRow{offset: 5, projection: "closed", status: "resolved"})
	got, err := deadletters.Depth(ctx, pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["accounts"] != 2 || got["ledger"] != 1 {
		t.Errorf("Depth = %v, want accounts:2 ledger:1", got)
	}
}
