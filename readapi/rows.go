package readapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Limits of a list.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Bounds of a min_version wait.
const (
	DefaultWait = 5 * time.Second
	MaxWait     = 30 * time.Second
)

// Response headers.
const (
	headerVersion    = "Projector-Version"
	headerStaleness  = "Projector-Staleness-Seconds"
	headerStale      = "Projector-Stale"
	headerMinVersion = "Projector-Min-Version"
)

// getRow answers GET /v1/projections/{name}/rows/{key}.
func (a *API) getRow(w http.ResponseWriter, r *http.Request, req *request) {
	key := r.PathValue("key")
	var q url.Values // nil without parameters: nothing to parse
	if r.URL.RawQuery != "" {
		q = r.URL.Query()
	}
	for param := range q {
		switch param {
		case "min_version", "wait", "stale":
		default:
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadParameter,
				Detail: fmt.Sprintf("unknown parameter %q: a row takes min_version, wait and stale", param)})
			return
		}
	}
	stale := false
	waitErr := error(nil)
	min, wait, ok := a.minVersion(w, r, q)
	if !ok {
		return
	}
	if s := q.Get("stale"); q.Has("stale") && s != "ok" {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadParameter, Detail: fmt.Sprintf("stale %q: the only value is ok", s)})
		return
	}
	if min > 0 {
		waitErr = a.cfg.Waiter.WaitVersion(r.Context(), req.view.p.Name, key, req.tenant(), min, wait)
		var deleted *DeletedError
		isDeleted := errors.As(waitErr, &deleted)
		if waitErr == nil || isDeleted || errors.Is(waitErr, ErrVersionNotReached) || errors.Is(waitErr, ErrTooManyWaiters) {
			a.heard.success(r.Context(), whatWaiting)
		}
		switch {
		case waitErr == nil:
		case isDeleted:
			at := deleted.Version
			writeProblem(w, problem{Status: http.StatusNotFound, Code: CodeNotFound, CurrentVersion: &at,
				Detail: fmt.Sprintf("the aggregate was deleted at version %d, at or above the version asked for", at)})
			return
		case errors.Is(waitErr, ErrTooManyWaiters):
			w.Header().Set("Retry-After", "1")
			writeProblem(w, problem{Status: http.StatusTooManyRequests, Code: CodeTooManyWaiters, Detail: "too many requests wait for a version; try again"})
			return
		case errors.Is(waitErr, ErrVersionNotReached):
			stale = q.Get("stale") == "ok"
		case r.Context().Err() != nil:
			return // the client left
		default:
			a.heard.failure(r.Context(), whatWaiting, waitErr, "projection", req.view.p.Name)
			writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the wait for the version failed"})
			return
		}
	}

	// Each statement is bounded by the statement timeout where it runs:
	// a read by key that goes in another's statement runs none of its own.
	v := req.view
	tbl, ok := a.columns(r.Context(), w, v)
	if !ok {
		return
	}
	row, err := a.getByKey(r.Context(), v, tbl, key, req.tenant())
	if err != nil {
		if isDataException(err) {
			row, err = nil, nil // a key its column's type cannot hold: no row has it
		} else {
			a.queryFailed(w, r, v, err)
			return
		}
	}
	if row == nil {
		if errors.Is(waitErr, ErrVersionNotReached) && !stale {
			writeProblem(w, problem{Status: http.StatusPreconditionFailed, Code: CodeVersionNotReached,
				Detail: "the aggregate has no row yet, and did not reach the version asked for within the wait"})
			return
		}
		writeProblem(w, problem{Status: http.StatusNotFound, Code: CodeNotFound, Detail: fmt.Sprintf("projection %q has no row of key %q", v.p.Name, key)})
		return
	}
	if errors.Is(waitErr, ErrVersionNotReached) && row.version >= min {
		// Reached between the wait's end and the read.
		waitErr, stale = nil, false
	}
	if errors.Is(waitErr, ErrVersionNotReached) && !stale {
		current := row.version
		writeProblem(w, problem{Status: http.StatusPreconditionFailed, Code: CodeVersionNotReached, CurrentVersion: &current,
			Detail: fmt.Sprintf("the aggregate is at version %d, below the version asked for, after the wait", current)})
		return
	}
	h := w.Header()
	version := strconv.FormatInt(row.version, 10)
	etag := `"` + version + `"`
	// The headers every row's answer has, by their canonical names (as
	// Set would store them) and with one allocation for their values
	// rather than one each: this is the API's most frequent answer.
	vals := [...]string{etag, version, "private, no-cache", "application/json", strconv.Itoa(len(row.json) + 1)}
	h["Etag"] = vals[0:1:1]
	h[headerVersion] = vals[1:2:2]
	h["Cache-Control"] = vals[2:3:3]
	if stale {
		h.Set(headerStale, "true")
	}
	a.staleness(r.Context(), h, v, key)
	if matches(r.Header.Values("If-None-Match"), etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h["Content-Type"] = vals[3:4:4]
	h["Content-Length"] = vals[4:5:5]
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(append(row.json, '\n'))
	}
}

// minVersion reads min_version (or else Projector-Min-Version) and wait; 0
// without a min_version. Each given is checked, with a min_version or
// not, so that a malformed one is refused wherever it is; wait alone
// changes nothing. A false ok means it answered the request.
func (a *API) minVersion(w http.ResponseWriter, r *http.Request, q url.Values) (min int64, wait time.Duration, ok bool) {
	bad := func(detail string) (int64, time.Duration, bool) {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadParameter, Detail: detail})
		return 0, 0, false
	}
	parse := func(raw string) (int64, bool) {
		v, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || v < 1 || strings.HasPrefix(raw, "+") {
			return 0, false
		}
		return v, true
	}
	if q.Has("min_version") {
		raw := q.Get("min_version")
		if min, ok = parse(raw); !ok {
			return bad(fmt.Sprintf("min_version %q: want a version, 1 or more", raw))
		}
	}
	if hs := r.Header.Values(headerMinVersion); len(hs) > 0 {
		h, ok := parse(hs[0])
		if !ok || len(hs) > 1 {
			return bad(fmt.Sprintf("%s %q: want one version, 1 or more", headerMinVersion, hs[0]))
		}
		if min == 0 {
			min = h // the query's min_version, when both are given
		}
	}
	wait = DefaultWait
	if q.Has("wait") {
		s := q.Get("wait")
		var err error
		if wait, err = parseWait(s); err != nil {
			return bad(fmt.Sprintf("wait %q: %v", s, err))
		}
	}
	if min == 0 {
		return 0, 0, true
	}
	if a.cfg.Waiter == nil {
		writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeMinVersionNotHere, Detail: "min_version is not served here: this process does not watch versions"})
		return 0, 0, false
	}
	return min, wait, true
}

// WaitPattern is the grammar of wait, which the OpenAPI document
// gives: seconds (2.5) or with a unit, s or ms (2.5s, 500ms), at most
// MaxWait. The bound is in the grammar, so that the document says
// exactly which waits are taken.
const WaitPattern = `^(0*(30(\.0*)?|[12]?[0-9](\.[0-9]*)?|\.[0-9]+)s?|0*(30000(\.0*)?|[12]?[0-9]{1,4}(\.[0-9]*)?|\.[0-9]+)ms)$`

var waitRe = regexp.MustCompile(WaitPattern)

// parseWait reads a wait of WaitPattern's grammar.
func parseWait(s string) (time.Duration, error) {
	if !waitRe.MatchString(s) {
		return 0, fmt.Errorf("want seconds (2.5) or a duration in s or ms (2s, 500ms), 0 to %s", MaxWait)
	}
	unit := time.Second
	if n, ok := strings.CutSuffix(s, "ms"); ok {
		s, unit = n, time.Millisecond
	} else {
		s = strings.TrimSuffix(s, "s")
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("want seconds: %w", err)
	}
	return time.Duration(f * float64(unit)), nil
}

// listRows answers GET /v1/projections/{name}/rows.
func (a *API) listRows(w http.ResponseWriter, r *http.Request, req *request) {
	v := req.view
	q := r.URL.Query()
	limit := DefaultLimit
	var after *string
	type filter struct{ col, value string }
	var filters []filter
	for param, values := range q {
		if len(values) != 1 {
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadParameter, Detail: fmt.Sprintf("parameter %q given %d times: give it once", param, len(values))})
			return
		}
		value := values[0]
		switch {
		case param == "limit":
			n, err := strconv.Atoi(value)
			if err != nil || n < 1 || n > MaxLimit {
				writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadParameter, Detail: fmt.Sprintf("limit %q: want 1 to %d", value, MaxLimit)})
				return
			}
			limit = n
		case param == "after":
			k, err := decodeCursor(value)
			if err != nil {
				writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadCursor, Detail: "after: not a cursor this API gave: pass the next link's as it is"})
				return
			}
			after = &k
		case v.isFilter[param]:
			filters = append(filters, filter{param, value})
		case param == "min_version" || param == "wait" || param == "stale":
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadParameter,
				Detail: param + " is taken by a row's route only: a list takes limit, after and filters"})
			return
		default:
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadFilter, Filterable: nonNil(v.filterable),
				Detail: fmt.Sprintf("%q is not a filterable column of projection %q: filterable are %s", param, v.p.Name, listOrNone(v.filterable))})
			return
		}
	}
	// The same query for the same parameters, whatever their order.
	sortFilters := func(a, b filter) int { return strings.Compare(a.col, b.col) }
	slices.SortFunc(filters, sortFilters)

	ctx, cancel := context.WithTimeout(r.Context(), a.cfg.StatementTimeout)
	defer cancel()
	tbl, ok := a.columns(ctx, w, v)
	if !ok {
		return
	}
	cols := tbl.cols
	for _, f := range filters {
		if c, ok := columnNamed(cols, f.col); ok && !c.accepts(f.value) {
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadFilter, Filterable: nonNil(v.filterable),
				Detail: fmt.Sprintf("filter %s=%q: not a value of the column's type (%s)", f.col, f.value, c.spelling())})
			return
		}
	}
	keyCol := pgx.Identifier{v.p.KeyColumn}.Sanitize()
	var where []string
	var args []any
	bind := func(col string, value any) {
		args = append(args, value)
		where = append(where, fmt.Sprintf("%s = $%d", pgx.Identifier{col}.Sanitize(), len(args)))
	}
	if t := req.tenant(); t != "" {
		bind(v.p.Tenant, t)
	}
	for _, f := range filters {
		bind(f.col, f.value)
	}
	if after != nil {
		args = append(args, *after)
		where = append(where, fmt.Sprintf("%s > $%d", keyCol, len(args)))
	}
	// The key as text is named apart from the key column, which ORDER BY
	// names: the same name on both would be ambiguous when the key is not
	// text.
	sql := "SELECT " + selectList(cols) + ", " + keyCol + "::text AS projector_cursor_key FROM " + quoteTable(v.p.Table)
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, limit+1)
	sql += fmt.Sprintf(" ORDER BY %s LIMIT $%d", keyCol, len(args))
	rows, err := a.query(ctx, v, cols, sql, args, limit+1, true)
	if err != nil {
		if isDataException(err) {
			writeProblem(w, problem{Status: http.StatusBadRequest, Code: CodeBadFilter, Filterable: nonNil(v.filterable),
				Detail: "a filter's value does not fit its column's type"})
			return
		}
		a.queryFailed(w, r, v, err)
		return
	}
	var next string
	if len(rows) > limit {
		rows = rows[:limit]
		nq := url.Values{}
		for _, f := range filters {
			nq.Set(f.col, f.value)
		}
		if q.Has("limit") {
			nq.Set("limit", strconv.Itoa(limit))
		}
		nq.Set("after", encodeCursor(rows[len(rows)-1].key))
		next = r.URL.Path + "?" + nq.Encode()
	}
	b := append(make([]byte, 0, 64+len(rows)*128), `{"rows":[`...)
	for i, row := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, row.json...)
	}
	b = append(b, `],"next":`...)
	if next == "" {
		b = append(b, "null"...)
	} else {
		b = appendString(b, next)
		w.Header().Set("Link", "<"+next+`>; rel="next"`)
	}
	b = append(b, "}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "private, no-cache")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	a.staleness(r.Context(), h, v, "")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b)
	}
}

// readRow is a row read: its JSON object, version and (in lists) its key
// in text form, for the cursor.
type readRow struct {
	json    []byte
	version int64
	key     string
}

// query runs sql, whose SELECT list is cols (and, withKey, the key as
// text after them), and returns its rows as JSON objects.
func (a *API) query(ctx context.Context, v *view, cols []column, sql string, args []any, capacity int, withKey bool) ([]readRow, error) {
	rows, err := a.cfg.DB.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	dest := make([]any, len(cols), len(cols)+1)
	vals := make([]any, len(cols))
	arrays := make([]pgtype.Array[any], len(cols))
	var key string
	for i := range cols {
		if cols[i].array {
			dest[i] = &arrays[i]
		} else {
			dest[i] = &vals[i]
		}
	}
	if withKey {
		dest = append(dest, &key)
	}
	out := make([]readRow, 0, capacity)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("projection %q: read a row: %w", v.p.Name, err)
		}
		b := append(make([]byte, 0, 256), '{')
		var version int64
		for i, c := range cols {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, c.name)
			b = append(b, ':')
			val := vals[i]
			if c.array {
				val = &arrays[i]
			}
			if b, err = c.appendJSON(b, val); err != nil {
				return nil, fmt.Errorf("projection %q: %w", v.p.Name, err)
			}
			if i == len(cols)-1 { // the version column
				if x, ok := val.(int64); ok {
					version = x
				}
			}
		}
		out = append(out, readRow{json: append(b, '}'), version: version, key: key})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	a.heard.success(ctx, whatReading)
	return out, nil
}

// columns answers 503 while v's table does not exist yet.
func (a *API) columns(ctx context.Context, w http.ResponseWriter, v *view) (*table, bool) {
	if t := v.cols.Load(); t != nil {
		return t, true
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.StatementTimeout)
	defer cancel()
	t, err := v.columns(ctx, a.cfg.DB)
	if err == nil {
		return t, true
	}
	if errors.Is(err, errNoTable) {
		w.Header().Set("Retry-After", "5")
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: fmt.Sprintf("the table of projection %q does not exist yet", v.p.Name)})
		return nil, false
	}
	a.heard.failure(ctx, whatReading, err, "projection", v.p.Name)
	writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the database could not be read"})
	return nil, false
}

// queryFailed answers a query's failure: a timeout, or the database.
func (a *API) queryFailed(w http.ResponseWriter, r *http.Request, v *view, err error) {
	if r.Context().Err() != nil {
		return // the client left: nobody to answer
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "42") || pgErr.Code == "0A000") {
		// The table changed under the columns read (a rebuild's
		// generation went live): read them again next time.
		v.forget()
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &pgErr) && pgErr.Code == "57014" {
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: CodeTimeout, Detail: "the query took longer than the statement timeout"})
		return
	}
	a.heard.failure(r.Context(), whatReading, err, "projection", v.p.Name)
	writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the database could not be read"})
}

// staleness sets Projector-Staleness-Seconds when a Staleness is
// configured and answers.
func (a *API) staleness(ctx context.Context, h http.Header, v *view, key string) {
	if a.cfg.Staleness == nil {
		return
	}
	what := v.staleness
	d, err := a.cfg.Staleness.Staleness(ctx, v.p.Name, key)
	if err != nil {
		// The header is left out: the row is still worth answering. An
		// operator hears why once, as a reader given another identity
		// than the engine's would otherwise go without it unnoticed.
		a.heard.failure(ctx, what, err, "projection", v.p.Name)
		return
	}
	a.heard.success(ctx, what)
	h.Set(headerStaleness, strconv.FormatFloat(max(0, d.Seconds()), 'f', 3, 64))
}

// isDataException reports whether err is Postgres refusing a value for
// its column's type (SQLSTATE class 22): a key or filter no row can have.
func isDataException(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// matches reports whether an If-None-Match header's values match etag.
func matches(values []string, etag string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimSpace(t)
			if t == "*" || t == etag || t == "W/"+etag {
				return true
			}
		}
	}
	return false
}

// A cursor is the last key of a page, JSON in base64url: opaque to
// clients, who pass the next link as it is.
func encodeCursor(key string) string {
	b, _ := json.Marshal([]string{key}) // a string slice always marshals
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", err
	}
	var keys []string
	if err := json.Unmarshal(b, &keys); err != nil || len(keys) != 1 {
		return "", errors.New("not a cursor")
	}
	return keys[0], nil
}

// quoteTable quotes a table name, schema-qualified or not.
func quoteTable(name string) string { return pgx.Identifier(strings.Split(name, ".")).Sanitize() }

func listOrNone(cols []string) string {
	if len(cols) == 0 {
		return "none (the projection declares no filterable columns)"
	}
	return strings.Join(cols, ", ")
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
