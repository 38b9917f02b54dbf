package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/readapi"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks"
)

// List limits: how many dead letters one list answers by default and at
// most.
const (
	ListDefaultLimit = 100
	ListMaxLimit     = 1000
)

// Purge limits, as the redrive's: how many dead letters one request
// purges by default and at most.
const (
	PurgeDefaultLimit = deadletters.RedriveDefaultLimit
	PurgeMaxLimit     = deadletters.RedriveMaxLimit
)

// Filter selects dead letters, as the dlq commands' flags do; every
// field is optional.
type Filter struct {
	Identity   string `json:"identity,omitempty"`
	Projection string `json:"projection,omitempty"`
	Topic      string `json:"topic,omitempty"`
	Key        string `json:"key,omitempty"`
	ErrorClass string `json:"error_class,omitempty"`
	Status     string `json:"status,omitempty"`
	// Since and Until bound first_seen: an RFC 3339 time, or how long
	// ago (90m, 24h, 7d).
	Since string `json:"since,omitempty"`
	Until string `json:"until,omitempty"`
}

// filter turns f into the store's filter, naming the field that is
// wrong.
func (f Filter) filter(now time.Time) (deadletters.Filter, error) {
	out := deadletters.Filter{Identity: f.Identity, Projection: f.Projection, Topic: f.Topic, Key: f.Key, ErrorClass: f.ErrorClass, Status: f.Status}
	if f.Status != "" && !deadletters.ValidStatus(f.Status) {
		return out, fmt.Errorf("status %q: want one of %s", f.Status, strings.Join(deadletters.Statuses, ", "))
	}
	if f.ErrorClass != "" && !slices.Contains(sinks.Classes, f.ErrorClass) {
		return out, fmt.Errorf("error_class %q: want one of %s", f.ErrorClass, strings.Join(sinks.Classes, ", "))
	}
	var err error
	if out.Since, err = parseWhen("since", f.Since, now); err != nil {
		return out, err
	}
	if out.Until, err = parseWhen("until", f.Until, now); err != nil {
		return out, err
	}
	if !out.Since.IsZero() && !out.Until.IsZero() && !out.Since.Before(out.Until) {
		return out, fmt.Errorf("since %s is not before until %s", f.Since, f.Until)
	}
	return out, nil
}

// parseWhen reads an RFC 3339 time or how long ago (a Go duration, or
// whole days such as 7d).
func parseWhen(field, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time such as 2026-12-01T09:00:00Z, or how long ago such as 24h or 7d", field, v)
}

// queryFilter reads the list's query parameters, refusing one it does
// not know.
func queryFilter(q url.Values) (Filter, int, int64, error) {
	known := []string{"identity", "projection", "topic", "key", "error_class", "status", "since", "until", "limit", "after"}
	for k, vs := range q {
		if !slices.Contains(known, k) {
			return Filter{}, 0, 0, fmt.Errorf("query parameter %s: unknown; want one of %s", k, strings.Join(known, ", "))
		}
		if len(vs) > 1 {
			return Filter{}, 0, 0, fmt.Errorf("query parameter %s: given %d times", k, len(vs))
		}
	}
	f := Filter{
		Identity: q.Get("identity"), Projection: q.Get("projection"), Topic: q.Get("topic"), Key: q.Get("key"),
		ErrorClass: q.Get("error_class"), Status: q.Get("status"), Since: q.Get("since"), Until: q.Get("until"),
	}
	limit := ListDefaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ListMaxLimit {
			return f, 0, 0, fmt.Errorf("limit %q: want a number from 1 to %d", v, ListMaxLimit)
		}
		limit = n
	}
	var after int64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return f, 0, 0, fmt.Errorf("after %q: want the id of a dead letter, as a page's next link gives it", v)
		}
		after = n
	}
	return f, limit, after, nil
}

func (s *server) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	qf, limit, after, err := queryFilter(r.URL.Query())
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	f, err := qf.filter(time.Now())
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	f.Limit, f.AfterID = limit, after
	// As dlq list does: an identity takes in its rebuilt projections'
	// generations, whose engines keep dead letters of their own.
	if f, err = rebuild.NewStore(s.cfg.DB).DeadLetterFilter(r.Context(), f); err != nil {
		s.fail(w, r, err)
		return
	}
	entries, err := deadletters.List(r.Context(), s.cfg.DB, f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if entries == nil {
		entries = []deadletters.Entry{}
	}
	page := map[string]any{"dead_letters": entries}
	if len(entries) == limit {
		// A full page may have more behind it: the same query from the
		// last id on.
		q := r.URL.Query()
		q.Set("after", strconv.FormatInt(entries[len(entries)-1].ID, 10))
		page["next"] = "/admin/v1/dead-letters?" + q.Encode()
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *server) showDeadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		badRequest(w, fmt.Sprintf("id %q: want a dead letter's id, a positive number", r.PathValue("id")))
		return
	}
	d, err := deadletters.Get(r.Context(), s.cfg.DB, id)
	if errors.Is(err, deadletters.ErrNoDeadLetter) {
		problem(w, http.StatusNotFound, readapi.CodeNotFound, fmt.Sprintf("no dead letter %d", id))
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// SelectBody is the body of a redrive and of a purge: the dead letters by
// ids or by filter (exactly one), at most limit of them, oldest first.
type SelectBody struct {
	IDs    []int64 `json:"ids,omitempty"`
	Filter *Filter `json:"filter,omitempty"`
	// Limit caps how many are acted on; 0: the default.
	Limit int `json:"limit,omitempty"`
	// DryRun answers what would be acted on, changing nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// SelectAnswer is the answer of a redrive and of a purge.
type SelectAnswer struct {
	DryRun bool `json:"dry_run"`
	// Matched are the ids selected (at most the limit), oldest first.
	Matched []int64 `json:"matched"`
	// Queued (redrive) are the dead letters queued for the workers that
	// own their partitions; an entry already queued, resolved or purged
	// is not.
	Queued []Queued `json:"queued,omitzero"`
	// Purged (purge) are the ids deleted.
	Purged []int64 `json:"purged,omitzero"`
}

// Queued is a dead letter a redrive queued, and for which worker: the
// one that owns its identity's topic and partition.
type Queued struct {
	ID         int64  `json:"id"`
	Identity   string `json:"identity"`
	Projection string `json:"projection"`
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
}

// selectIDs reads a SelectBody and finds its ids, answering an error
// itself; ok reports whether to go on.
func (s *server) selectIDs(w http.ResponseWriter, r *http.Request, defaultLimit, maxLimit int) (body SelectBody, ids []int64, audit any, ok bool) {
	if !decode(w, r, &body) {
		return body, nil, nil, false
	}
	switch {
	case body.Limit < 0 || body.Limit > maxLimit:
		badRequest(w, fmt.Sprintf("limit %d: want 1 to %d, or 0 for %d", body.Limit, maxLimit, defaultLimit))
		return body, nil, nil, false
	case (body.IDs == nil) == (body.Filter == nil):
		badRequest(w, "ids, filter: give exactly one: the dead letters' ids, or a filter that selects them")
		return body, nil, nil, false
	}
	limit := body.Limit
	if limit == 0 {
		limit = defaultLimit
	}
	if body.IDs != nil {
		if len(body.IDs) == 0 || len(body.IDs) > limit {
			badRequest(w, fmt.Sprintf("ids: %d given; want 1 to %d (limit)", len(body.IDs), limit))
			return body, nil, nil, false
		}
		ids, err := deadletters.IDs(r.Context(), s.cfg.DB, deadletters.Filter{IDs: body.IDs})
		if err != nil {
			s.fail(w, r, err)
			return body, nil, nil, false
		}
		return body, ids, deadletters.Filter{IDs: body.IDs}, true
	}
	f, err := body.Filter.filter(time.Now())
	if err != nil {
		badRequest(w, "filter: "+err.Error())
		return body, nil, nil, false
	}
	f.Limit = limit
	// The audit keeps the filter as given; the ids take in the
	// identity's generations, as the list does.
	wide, err := rebuild.NewStore(s.cfg.DB).DeadLetterFilter(r.Context(), f)
	if err == nil {
		ids, err = deadletters.IDs(r.Context(), s.cfg.DB, wide)
	}
	if err != nil {
		s.fail(w, r, err)
		return body, nil, nil, false
	}
	return body, ids, f, true
}

func (s *server) redrive(w http.ResponseWriter, r *http.Request) {
	body, ids, filter, ok := s.selectIDs(w, r, deadletters.RedriveDefaultLimit, deadletters.RedriveMaxLimit)
	if !ok {
		return
	}
	ans := SelectAnswer{DryRun: body.DryRun, Matched: nonNil(ids)}
	if body.DryRun {
		writeJSON(w, http.StatusOK, ans)
		return
	}
	var queued []deadletters.Queued
	err := pgx.BeginFunc(r.Context(), s.cfg.DB, func(tx pgx.Tx) error {
		var err error
		queued, err = deadletters.RedriveTx(r.Context(), tx, ids, actorOf(r.Context()), filter)
		return err
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ans.Queued = make([]Queued, len(queued))
	for i, q := range queued {
		ans.Queued[i] = Queued{ID: q.ID, Identity: q.Identity, Projection: q.Projection, Topic: q.Topic, Partition: q.Partition}
	}
	writeJSON(w, http.StatusAccepted, ans)
}

func (s *server) purge(w http.ResponseWriter, r *http.Request) {
	body, ids, filter, ok := s.selectIDs(w, r, PurgeDefaultLimit, PurgeMaxLimit)
	if !ok {
		return
	}
	ans := SelectAnswer{DryRun: body.DryRun, Matched: nonNil(ids)}
	if body.DryRun {
		writeJSON(w, http.StatusOK, ans)
		return
	}
	err := pgx.BeginFunc(r.Context(), s.cfg.DB, func(tx pgx.Tx) error {
		var err error
		ans.Purged, err = deadletters.PurgeTx(r.Context(), tx, ids, actorOf(r.Context()), filter)
		return err
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ans.Purged = nonNil(ans.Purged)
	writeJSON(w, http.StatusOK, ans)
}

func nonNil(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}
