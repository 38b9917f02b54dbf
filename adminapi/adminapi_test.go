package adminapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projector-dev/projector/adminapi"
	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks/postgres"
)

// tokens authenticates the tests' bearer tokens: each names a principal.
type tokens map[string]auth.Principal

func (t tokens) Authenticate(r *http.Request) (auth.Principal, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	p, known := t[tok]
	if !ok || !known {
		return auth.Principal{}, auth.ErrUnauthenticated
	}
	return p, nil
}

var testTokens = tokens{
	"admin-token":  {Subject: "alice", Scopes: []string{auth.ScopeAdmin}},
	"reader-token": {Subject: "bob", Scopes: []string{auth.ScopeReadAll}},
}

type fixture struct {
	pool *pgxpool.Pool
	url  string
}

// resetter answers offset resets with a fixed plan, recording the
// request, in place of the brokers.
type resetter struct{ got []adminapi.Reset }

func (r *resetter) ResetOffsets(_ context.Context, who deadletters.Actor, reset adminapi.Reset) (adminapi.ResetAnswer, error) {
	r.got = append(r.got, reset)
	return adminapi.ResetAnswer{DryRun: reset.DryRun, Partitions: []adminapi.ResetLine{{Topic: reset.Topic, NewOffset: 7, Note: who.Name}}}, nil
}

func newFixture(t *testing.T, offsets adminapi.OffsetResetter) fixture {
	t.Helper()
	db := testenv.NewDB(t)
	if err := postgres.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if err := rebuild.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatalf("migrate rebuilds: %v", err)
	}
	cfg := adminapi.Config{DB: db.Pool, Identity: "ident", Authenticator: testTokens}
	if offsets != nil {
		cfg.Offsets = offsets
	}
	h, err := adminapi.Handler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return fixture{pool: db.Pool, url: srv.URL}
}

// do sends a request with token ("" for none) and decodes the JSON
// answer.
func (f fixture) do(t *testing.T, token, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s %s: %d, not a JSON object: %s", method, path, resp.StatusCode, b)
	}
	if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("%s %s: %d with Content-Type %q, want a problem", method, path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, out
}

func (f fixture) insert(t *testing.T, projection, status string, offset int64) int64 {
	t.Helper()
	var id int64
	err := f.pool.QueryRow(t.Context(), `INSERT INTO projector_dead_letters
		(identity, projection, topic, partition, "offset", record_key, value, error, error_class, status)
		VALUES ('ident', $1, 'accounts.events', 0, $2, 'k', 'v', 'boom', 'decode', $3) RETURNING id`,
		projection, offset, status).Scan(&id)
	if err != nil {
		t.Fatalf("insert dead letter: %v", err)
	}
	return id
}

// audit is the dead-letter audit log, oldest first.
func (f fixture) audit(t *testing.T) []deadletters.AuditEntry {
	t.Helper()
	a, err := deadletters.ListAudit(t.Context(), f.pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(a)
	return a
}

// TestAdminScope: no or a wrong token is a 401, a token without the admin
// scope a 403, on every route, rebuilds' included; the admin token gets
// through.
func TestAdminScope(t *testing.T) {
	f := newFixture(t, nil)
	routes := []struct{ method, path, body string }{
		{"GET", "/admin/v1/dead-letters", ""},
		{"GET", "/admin/v1/dead-letters/1", ""},
		{"POST", "/admin/v1/dead-letters/redrives", `{"ids":[1]}`},
		{"POST", "/admin/v1/dead-letters/purges", `{"ids":[1]}`},
		{"POST", "/admin/v1/offsets/resets", `{"topic":"t","to":"earliest"}`},
		{"POST", "/admin/v1/projections/accounts/rebuilds", ""},
		{"GET", "/admin/v1/operations", ""},
		{"DELETE", "/admin/v1/operations/x", ""},
	}
	for _, r := range routes {
		for token, want := range map[string]int{"": 401, "wrong": 401, "reader-token": 403} {
			code, p := f.do(t, token, r.method, r.path, r.body)
			if code != want {
				t.Errorf("%s %s with token %q: %d %v, want %d", r.method, r.path, token, code, p, want)
			}
		}
	}
	if code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters", ""); code != 200 {
		t.Errorf("list with the admin token: %d %v", code, body)
	}
	if code, body := f.do(t, "admin-token", "GET", "/admin/v1/operations", ""); code != 200 {
		t.Errorf("operations with the admin token: %d %v", code, body)
	}
}

func TestListAndShowDeadLetters(t *testing.T) {
	f := newFixture(t, nil)
	a := f.insert(t, "accounts", "open", 1)
	f.insert(t, "accounts", "resolved", 2)
	c := f.insert(t, "orders", "open", 3)
	code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters?status=open&limit=10", "")
	if got := idsOf(body["dead_letters"]); code != 200 || !slices.Equal(got, []int64{a, c}) {
		t.Errorf("status=open: %d %v, want %d and %d", code, got, a, c)
	}
	code, body = f.do(t, "admin-token", "GET", "/admin/v1/dead-letters?projection=orders", "")
	if got := idsOf(body["dead_letters"]); code != 200 || !slices.Equal(got, []int64{c}) {
		t.Errorf("projection=orders: %d %v, want %d", code, got, c)
	}
	code, body = f.do(t, "admin-token", "GET", fmt.Sprintf("/admin/v1/dead-letters/%d", a), "")
	if code != 200 || body["id"] != float64(a) || body["projection"] != "accounts" || body["error"] != "boom" {
		t.Errorf("show %d: %d %v", a, code, body)
	}
	if code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters/999999", ""); code != 404 || body["code"] != "not_found" {
		t.Errorf("show a missing one: %d %v, want 404 not_found", code, body)
	}
	for query, field := range map[string]string{
		"status=sideways":   "status",
		"error_class=nope":  "error_class",
		"limit=1001":        "limit",
		"limit=0":           "limit",
		"since=yesterday":   "since",
		"colour=red":        "colour",
		"since=1h&until=2h": "since",
	} {
		code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters?"+query, "")
		if code != 400 || body["code"] != "bad_request" || !strings.Contains(fmt.Sprint(body["detail"]), field) {
			t.Errorf("?%s: %d %v, want 400 naming %s", query, code, body, field)
		}
	}
	if code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters/abc", ""); code != 400 || !strings.Contains(fmt.Sprint(body["detail"]), "id") {
		t.Errorf("show abc: %d %v, want 400 naming id", code, body)
	}
}

// TestListPages: a full page links the next, the same query from its
// last id on; the pages together are the whole list, once each, in id
// order, through an identity's generations too.
func TestListPages(t *testing.T) {
	f := newFixture(t, nil)
	if _, err := f.pool.Exec(t.Context(), `INSERT INTO projector_generations
		(identity, projection, generation, state, table_name, physical_table, group_id, definition, definition_hash) VALUES
		('ident', 'accounts', 2, 'live', 'accounts', 'accounts_g2', 'ident.accounts.g2', '{}', 'h2')`); err != nil {
		t.Fatal(err)
	}
	var want []int64
	for i := range 7 {
		identity := "ident"
		if i%3 == 1 {
			identity = "ident.accounts.g2"
		}
		var id int64
		if err := f.pool.QueryRow(t.Context(), `INSERT INTO projector_dead_letters
			(identity, projection, topic, partition, "offset", record_key, value, error, error_class, status)
			VALUES ($1, 'accounts', 'accounts.events', 0, $2, 'k', 'v', 'boom', 'decode', 'open') RETURNING id`, identity, i).Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	f.insert(t, "orders", "open", 99) // another projection's: on no page
	var got []int64
	next := "/admin/v1/dead-letters?identity=ident&projection=accounts&limit=3"
	pages := 0
	for next != "" {
		pages++
		if pages > 5 {
			t.Fatalf("more than 5 pages of 3 for 7 dead letters; ids so far %v", got)
		}
		code, body := f.do(t, "admin-token", "GET", next, "")
		if code != 200 {
			t.Fatalf("GET %s: %d %v", next, code, body)
		}
		ids := idsOf(body["dead_letters"])
		got = append(got, ids...)
		next, _ = body["next"].(string)
		if full := len(ids) == 3; full != (next != "") {
			t.Fatalf("GET %s: %d entries, next %q: want a next link exactly on a full page", next, len(ids), next)
		}
	}
	if !slices.Equal(got, want) || pages != 3 {
		t.Errorf("pages gave %v in %d pages, want %v in 3", got, pages, want)
	}
	for _, after := range []string{"0", "-1", "abc"} {
		code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters?after="+after, "")
		if code != 400 || !strings.Contains(fmt.Sprint(body["detail"]), "after") {
			t.Errorf("after=%s: %d %v, want 400 naming after", after, code, body)
		}
	}
}

// TestIdentityTakesInGenerations: as with dlq list, an identity filter
// takes in its rebuilt projections' live generations and those being
// built, whose engines keep dead letters under identities of their own;
// a retired generation's and another identity's stay out.
func TestIdentityTakesInGenerations(t *testing.T) {
	f := newFixture(t, nil)
	if _, err := f.pool.Exec(t.Context(), `INSERT INTO projector_generations
		(identity, projection, generation, state, table_name, physical_table, group_id, definition, definition_hash) VALUES
		('ident', 'accounts', 2, 'live', 'accounts', 'accounts_g2', 'ident.accounts.g2', '{}', 'h2'),
		('ident', 'accounts', 3, 'building', 'accounts', 'accounts_g3', 'ident.accounts.g3', '{}', 'h3'),
		('ident', 'accounts', 1, 'retired', 'accounts', 'accounts', 'ident', '{}', 'h1'),
		('ident', 'orders', 2, 'retired', 'orders', 'orders_g2', 'ident.orders.g2', '{}', 'h4')`); err != nil {
		t.Fatal(err)
	}
	insert := func(identity string) int64 {
		var id int64
		if err := f.pool.QueryRow(t.Context(), `INSERT INTO projector_dead_letters
			(identity, projection, topic, partition, "offset", record_key, value, error, error_class, status)
			VALUES ($1, 'accounts', 'accounts.events', 0, 1, 'k', 'v', 'boom', 'decode', 'open') RETURNING id`, identity).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	own, live, building := insert("ident"), insert("ident.accounts.g2"), insert("ident.accounts.g3")
	insert("ident.orders.g2")
	insert("other")
	want := []int64{own, live, building}
	code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters?identity=ident", "")
	if got := idsOf(body["dead_letters"]); code != 200 || !slices.Equal(got, want) {
		t.Errorf("list identity=ident: %d %v, want %v", code, got, want)
	}
	code, body = f.do(t, "admin-token", "GET", "/admin/v1/dead-letters?identity=ident&limit=2", "")
	if got := idsOf(body["dead_letters"]); code != 200 || !slices.Equal(got, want[:2]) {
		t.Errorf("list identity=ident limit=2: %d %v, want %v", code, got, want[:2])
	}
	code, body = f.do(t, "admin-token", "POST", "/admin/v1/dead-letters/purges", `{"filter":{"identity":"ident"},"dry_run":true}`)
	if code != 200 || !slices.Equal(numbers(body["matched"]), want) {
		t.Errorf("purge identity=ident, dry run: %d %v, want %v matched", code, body, want)
	}
}

func idsOf(v any) []int64 {
	var out []int64
	for _, e := range v.([]any) {
		out = append(out, int64(e.(map[string]any)["id"].(float64)))
	}
	return out
}

func numbers(v any) []int64 {
	var out []int64
	for _, e := range v.([]any) {
		out = append(out, int64(e.(float64)))
	}
	return out
}

// TestRedrive queues dead letters for their owning workers with the
// subject in the audit row; a dry run changes nothing.
func TestRedrive(t *testing.T) {
	f := newFixture(t, nil)
	a := f.insert(t, "accounts", "open", 1)
	b := f.insert(t, "accounts", "open", 2)
	resolved := f.insert(t, "accounts", "resolved", 3)
	code, body := f.do(t, "admin-token", "POST", "/admin/v1/dead-letters/redrives", `{"filter":{"projection":"accounts","status":"open"},"dry_run":true}`)
	if code != 200 || body["dry_run"] != true || !slices.Equal(numbers(body["matched"]), []int64{a, b}) {
		t.Errorf("dry run: %d %v", code, body)
	}
	if n := len(f.audit(t)); n != 0 {
		t.Errorf("a dry run wrote %d audit rows", n)
	}
	code, body = f.do(t, "admin-token", "POST", "/admin/v1/dead-letters/redrives", fmt.Sprintf(`{"ids":[%d,%d]}`, a, resolved))
	if code != 202 || len(body["queued"].([]any)) != 1 {
		t.Fatalf("redrive: %d %v, want 202 with one queued", code, body)
	}
	var status string
	var queued int
	if err := f.pool.QueryRow(t.Context(), `SELECT d.status, (SELECT count(*) FROM projector_redrives WHERE dead_letter_id = d.id AND requested_by = 'alice')
		FROM projector_dead_letters d WHERE id = $1`, a).Scan(&status, &queued); err != nil {
		t.Fatal(err)
	}
	if status != deadletters.StatusQueued || queued != 1 {
		t.Errorf("dead letter %d: status %s, %d queued by alice; want queued once", a, status, queued)
	}
	audit := f.audit(t)
	if len(audit) != 1 || audit[0].Actor != "alice" || audit[0].Action != deadletters.AuditRedrive || audit[0].OSUser != "" ||
		audit[0].DBUser == "" || !slices.Equal(audit[0].EntryIDs, []int64{a}) {
		t.Errorf("audit: %+v, want one redrive of %d by alice with the database user", audit, a)
	}
}

// TestPurge deletes dead letters with the subject in the audit row.
func TestPurge(t *testing.T) {
	f := newFixture(t, nil)
	a := f.insert(t, "accounts", "open", 1)
	b := f.insert(t, "accounts", "open", 2)
	keep := f.insert(t, "orders", "open", 3)
	code, body := f.do(t, "admin-token", "POST", "/admin/v1/dead-letters/purges", `{"filter":{"projection":"accounts"},"limit":1}`)
	if code != 200 || !slices.Equal(numbers(body["purged"]), []int64{a}) {
		t.Fatalf("purge with limit 1: %d %v, want %d purged", code, body, a)
	}
	left, err := deadletters.IDs(t.Context(), f.pool, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []int64{b, keep}) {
		t.Errorf("left %v, want %d and %d", left, b, keep)
	}
	audit := f.audit(t)
	if len(audit) != 1 || audit[0].Actor != "alice" || audit[0].Action != deadletters.AuditPurge || !slices.Equal(audit[0].EntryIDs, []int64{a}) ||
		!strings.Contains(strings.ReplaceAll(string(audit[0].Filter), " ", ""), `"projection":"accounts"`) {
		t.Errorf("audit: %+v, want one purge of %d by alice with its filter", audit, a)
	}
}

// TestAuditCommitsWithEffect: when the effect fails, no audit row is
// left; the audit row and the effect commit together.
func TestAuditCommitsWithEffect(t *testing.T) {
	f := newFixture(t, nil)
	a := f.insert(t, "accounts", "open", 1)
	// The audit row is written after the effect, in its transaction: a
	// failing audit insert must take the effect with it too.
	if _, err := f.pool.Exec(t.Context(), `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by the test'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(t.Context(), `CREATE TRIGGER refuse BEFORE INSERT ON projector_dlq_audit FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/admin/v1/dead-letters/purges", "/admin/v1/dead-letters/redrives"} {
		code, body := f.do(t, "admin-token", "POST", path, fmt.Sprintf(`{"ids":[%d]}`, a))
		if code != 500 {
			t.Errorf("%s with the audit refused: %d %v, want 500", path, code, body)
		}
	}
	d, err := deadletters.Get(t.Context(), f.pool, a)
	if err != nil || d.Status != deadletters.StatusOpen {
		t.Errorf("dead letter %d after the failed actions: %+v %v, want it still open", a, d, err)
	}
	// Now the effect fails: no audit row.
	if _, err := f.pool.Exec(t.Context(), `DROP TRIGGER refuse ON projector_dlq_audit;
		CREATE TRIGGER refuse BEFORE DELETE OR UPDATE ON projector_dead_letters FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/admin/v1/dead-letters/purges", "/admin/v1/dead-letters/redrives"} {
		if code, body := f.do(t, "admin-token", "POST", path, fmt.Sprintf(`{"ids":[%d]}`, a)); code != 500 {
			t.Errorf("%s with the effect refused: %d %v, want 500", path, code, body)
		}
	}
	if audit := f.audit(t); len(audit) != 0 {
		t.Errorf("audit rows of failed actions: %+v", audit)
	}
}

func TestBadBodies(t *testing.T) {
	f := newFixture(t, nil)
	for _, c := range []struct{ path, body, field string }{
		{"/admin/v1/dead-letters/redrives", ``, "body"},
		{"/admin/v1/dead-letters/redrives", `{}`, "ids, filter"},
		{"/admin/v1/dead-letters/redrives", `{"ids":[1],"filter":{}}`, "ids, filter"},
		{"/admin/v1/dead-letters/redrives", `{"ids":[]}`, "ids"},
		{"/admin/v1/dead-letters/redrives", `{"ids":[1],"limit":10001}`, "limit"},
		{"/admin/v1/dead-letters/redrives", `{"ids":[1,2],"limit":1}`, "ids"},
		{"/admin/v1/dead-letters/redrives", `{"ids":["x"]}`, "ids"},
		{"/admin/v1/dead-letters/purges", `{"filter":{"status":"gone"}}`, "status"},
		{"/admin/v1/dead-letters/purges", `{"filter":{"since":"soon"}}`, "since"},
		{"/admin/v1/dead-letters/purges", `{"ids":[1],"actor":"mallory"}`, "actor"},
		{"/admin/v1/offsets/resets", `{"to":"earliest"}`, "topic"},
		{"/admin/v1/offsets/resets", `{"topic":"t"}`, "to, to_offset, to_datetime"},
		{"/admin/v1/offsets/resets", `{"topic":"t","to":"earliest","to_offset":3}`, "to, to_offset, to_datetime"},
		{"/admin/v1/offsets/resets", `{"topic":"t","to":"start"}`, "to"},
		{"/admin/v1/offsets/resets", `{"topic":"t","to_offset":-1}`, "to_offset"},
		{"/admin/v1/offsets/resets", `{"topic":"t","to_datetime":"monday"}`, "to_datetime"},
		{"/admin/v1/offsets/resets", `{"topic":"t","to":"latest","partitions":[1,1]}`, "partitions"},
		{"/admin/v1/projections/accounts/rebuilds", `{"actor":"mallory"}`, "actor"},
		{"/admin/v1/projections/accounts/rollbacks", `{"actor":"mallory"}`, "actor"},
	} {
		code, body := f.do(t, "admin-token", "POST", c.path, c.body)
		if code != 400 || !strings.Contains(fmt.Sprint(body["detail"]), c.field) {
			t.Errorf("POST %s %s: %d %v, want 400 naming %s", c.path, c.body, code, body, c.field)
		}
	}
	big := `{"ids":[` + strings.Repeat("1,", adminapi.MaxBody/2) + `1]}`
	if code, body := f.do(t, "admin-token", "POST", "/admin/v1/dead-letters/purges", big); code != 413 {
		t.Errorf("a body over the limit: %d %v, want 413", code, body)
	}
}

// TestOffsetResets: without the brokers a reset is 501; with them the
// checked reset reaches the resetter with the subject.
func TestOffsetResets(t *testing.T) {
	f := newFixture(t, nil)
	if code, body := f.do(t, "admin-token", "POST", "/admin/v1/offsets/resets", `{"topic":"t","to":"earliest"}`); code != 501 || body["code"] != "not_served" {
		t.Errorf("without brokers: %d %v, want 501 not_served", code, body)
	}
	r := &resetter{}
	f = newFixture(t, r)
	code, body := f.do(t, "admin-token", "POST", "/admin/v1/offsets/resets", `{"topic":"t","partitions":[2,0],"to_datetime":"2026-12-01T09:00:00Z"}`)
	if code != 200 || len(r.got) != 1 || !slices.Equal(r.got[0].Partitions, []int32{0, 2}) ||
		!r.got[0].At.Equal(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)) || r.got[0].DryRun {
		t.Fatalf("reset: %d %v, resetter got %+v", code, body, r.got)
	}
	if line := body["partitions"].([]any)[0].(map[string]any); line["note"] != "alice" {
		t.Errorf("the resetter's actor: %v, want alice", line["note"])
	}
}

// TestRebuildActorIsTheSubject: a rebuild started and cancelled over the
// admin API records the authenticated subject as its actor, and its
// errors are problems.
func TestRebuildActorIsTheSubject(t *testing.T) {
	f := newFixture(t, nil)
	projs, err := projection.Parse([]byte(`projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: snapshot
    columns:
      account_id: {type: text, primary_key: true}
      owner: {type: text}
`), "")
	if err != nil {
		t.Fatal(err)
	}
	store := rebuild.NewStore(f.pool)
	if _, err := store.Ensure(t.Context(), "ident", projs); err != nil {
		t.Fatal(err)
	}
	code, body := f.do(t, "admin-token", "POST", "/admin/v1/projections/accounts/rebuilds", `{"retain":"48h"}`)
	if code != http.StatusAccepted || body["actor"] != "alice" {
		t.Fatalf("start: %d %v, want 202 by alice", code, body)
	}
	id := body["operation_id"].(string)
	code, body = f.do(t, "admin-token", "POST", "/admin/v1/projections/accounts/rebuilds", "")
	if code != http.StatusConflict || body["type"] == nil || !strings.Contains(fmt.Sprint(body["detail"]), id) {
		t.Errorf("a second start: %d %v, want a 409 problem naming %s", code, body, id)
	}
	if code, body := f.do(t, "admin-token", "DELETE", "/admin/v1/operations/"+id+"?actor=mallory", ""); code != 400 {
		t.Errorf("a cancel naming its actor: %d %v, want 400", code, body)
	}
	if code, body := f.do(t, "admin-token", "DELETE", "/admin/v1/operations/"+id, ""); code != 200 || body["state"] != "cancelled" {
		t.Errorf("cancel: %d %v", code, body)
	}
	var actors []string
	rows, err := f.pool.Query(t.Context(), `SELECT DISTINCT actor FROM projector_rebuilds`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actors = append(actors, a)
	}
	if rows.Err() != nil || !slices.Equal(actors, []string{"alice"}) {
		t.Errorf("the operation's actors: %v %v, want alice", actors, rows.Err())
	}
}

// TestFailuresHeardOnce: while PostgreSQL cannot be reached every request
// is a 500, and the log says so once.
func TestFailuresHeardOnce(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/test?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs bytes.Buffer
	h, err := adminapi.Handler(adminapi.Config{DB: pool, Identity: "ident", Authenticator: testTokens,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := fixture{pool: pool, url: srv.URL}
	for range 3 {
		if code, body := f.do(t, "admin-token", "GET", "/admin/v1/dead-letters", ""); code != 500 || body["code"] != "internal" {
			t.Errorf("list without PostgreSQL: %d %v, want 500 internal", code, body)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d failure lines for 3 failing requests, want 1:\n%s", n, &logs)
	}
}
