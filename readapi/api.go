package readapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/projection"
)

// DefaultStatementTimeout bounds each request's query when
// Config.StatementTimeout is 0.
const DefaultStatementTimeout = 5 * time.Second

// Querier runs the API's queries: a *pgxpool.Pool, whose size bounds the
// queries running at once.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Staleness tells how far behind the events of a projection its table
// is. The API answers it in Projector-Staleness-Seconds.
type Staleness interface {
	// Staleness is how far behind the partition that owns key is, 0 when
	// it is caught up; with key "" the projection's furthest behind
	// partition.
	Staleness(ctx context.Context, projection, key string) (time.Duration, error)
}

// Waiter waits for an aggregate to reach a version: read-your-writes.
type Waiter interface {
	// WaitVersion returns nil once the aggregate key of projection has
	// reached version min (its row's version is min or more), a
	// *DeletedError when it was deleted at min or above, an error wrapping
	// ErrVersionNotReached when wait passes first, and one wrapping
	// ErrTooManyWaiters when the process waits for too many already.
	// tenant, when not empty, is the reader's: a wait must tell it
	// nothing of another tenant's rows.
	WaitVersion(ctx context.Context, projection, key, tenant string, min int64, wait time.Duration) error
}

// Errors a Waiter returns.
var (
	ErrVersionNotReached = errors.New("version not reached")
	ErrTooManyWaiters    = errors.New("too many waiters")
)

// DeletedError is what a Waiter returns when the aggregate was deleted at
// a version at or above the one waited for: the API answers 404 with that
// version, so that a reader waiting for its own delete knows it landed.
type DeletedError struct{ Version int64 }

func (e *DeletedError) Error() string {
	return "deleted at version " + strconv.FormatInt(e.Version, 10)
}

// Config configures the API. Projections, DB and Authenticator are
// required; the zero value of every other field is a working choice.
type Config struct {
	// Projections are those served, by name.
	Projections []*projection.Projection
	// Admin says the admin API is served beside this one: /openapi.json
	// describes its routes too.
	Admin bool
	// DB reads their tables.
	DB Querier
	// Authenticator finds each request's principal: auth.None for
	// none.
	Authenticator auth.Authenticator
	// Staleness, when set, fills Projector-Staleness-Seconds.
	Staleness Staleness
	// Waiter, when set, serves min_version; without one a request with
	// min_version is a 400 (min_version_not_served).
	Waiter Waiter
	// StatementTimeout bounds each request's query; 0:
	// DefaultStatementTimeout.
	StatementTimeout time.Duration
	// Logger writes one line per request at info level (never a
	// header: no token reaches it) and the API's failures; nil discards.
	Logger *slog.Logger
	// Registerer registers the API's metrics; nil registers none.
	Registerer prometheus.Registerer
}

func (c *Config) validate() error {
	if len(c.Projections) == 0 {
		return errors.New("readapi: Projections: none to serve")
	}
	if c.DB == nil {
		return errors.New("readapi: DB is required")
	}
	if c.Authenticator == nil {
		return errors.New("readapi: Authenticator is required (auth.None{} for none)")
	}
	if c.StatementTimeout < 0 {
		return fmt.Errorf("readapi: StatementTimeout %s: must be positive, or 0 for the default", c.StatementTimeout)
	}
	return nil
}

// API serves the projections' rows. It is an http.Handler; wrap it in
// NewServer's server, or mount it beside other routes under /v1/ and
// /openapi.json.
type API struct {
	cfg     Config
	log     *slog.Logger
	views   map[string]*view
	mux     *http.ServeMux
	metrics *metrics
	heard   *heard
	// document is the OpenAPI document served at /openapi.json.
	document []byte
	routes   []string
}

// view is one projection as the API reads it.
type view struct {
	p          *projection.Projection
	scope      string   // the scope that allows reading it
	staleness  string   // what heard calls telling its staleness
	filterable []string // sorted, for error messages
	isFilter   map[string]bool

	// cols are the table's columns, read once the table exists: a
	// request finds them without a lock.
	cols atomic.Pointer[table]

	batches batches    // its reads by key
	mu      sync.Mutex // one reader of the columns at a time
}

// New returns the API of cfg.
func New(cfg Config) (*API, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.StatementTimeout == 0 {
		cfg.StatementTimeout = DefaultStatementTimeout
	}
	a := &API{cfg: cfg, log: cfg.Logger, views: map[string]*view{}, mux: http.NewServeMux()}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.heard = &heard{log: a.log, failed: map[string]bool{}}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	a.metrics = m
	for _, p := range cfg.Projections {
		if _, ok := a.views[p.Name]; ok {
			return nil, fmt.Errorf("readapi: projection %q given twice", p.Name)
		}
		v := &view{p: p, scope: auth.ReadScope(p.Name), staleness: whatStaleness + p.Name, filterable: slices.Sorted(slices.Values(p.Filterable)), isFilter: map[string]bool{}}
		v.batches.limit = defaultBatches
		if n := poolSize(cfg.DB); n > 0 {
			v.batches.limit = n
		}
		v.batches.queues = map[string]*getQueue{}
		for _, c := range p.Filterable {
			v.isFilter[c] = true
		}
		a.views[p.Name] = v
	}
	var docOpts []DocumentOption
	if cfg.Admin {
		docOpts = append(docOpts, WithAdmin())
	}
	if a.document, err = Document(cfg.Projections, docOpts...); err != nil {
		return nil, err
	}
	a.handle(routeRow, a.getRow)
	a.handle(routeRows, a.listRows)
	a.handle(routeOpenAPI, func(w http.ResponseWriter, r *http.Request, _ *request) { a.serveDocument(w, r) })
	a.mux.Handle("/", a.route(routeOther, func(w http.ResponseWriter, r *http.Request, _ *request) {
		writeProblem(w, problem{Status: http.StatusNotFound, Code: CodeNotFound, Detail: "no such route"})
	}))
	return a, nil
}

// What heard tells failing and succeeding again.
const (
	whatAuthenticating = "authenticating requests"
	whatWaiting        = "waiting for versions"
	whatReading        = "reading PostgreSQL"
	// whatStaleness is followed by the projection's name.
	whatStaleness = "telling the staleness of projection "
)

// The routes, as the metrics' route label names them.
const (
	routeRow   = "/v1/projections/{name}/rows/{key}"
	routeRows  = "/v1/projections/{name}/rows"
	routeOther = "other"
)

// handle registers the route pattern, which is also its metrics' label.
func (a *API) handle(pattern string, h func(http.ResponseWriter, *http.Request, *request)) {
	a.mux.Handle(pattern, a.route(pattern, h))
	a.routes = append(a.routes, pattern)
}

// Routes are the patterns of the routes the API serves: each is in its
// OpenAPI document (a {name} once per projection). Any other path
// answers 404.
func (a *API) Routes() []string { return slices.Clone(a.routes) }

// ServeHTTP serves r.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// request is what the API knows of a request once it is authenticated.
type request struct {
	principal auth.Principal
	view      *view
}

// route wraps a route's handler with what every route does: the body
// check, metrics, the access log, authentication, the projection's
// lookup and its scope.
func (a *API) route(name string, h func(http.ResponseWriter, *http.Request, *request)) http.Handler {
	m := a.metrics.route(name)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// One allocation for what a request keeps: the recorder and the
		// request as authenticated.
		ex := &exchange{recorder: recorder{ResponseWriter: w, status: http.StatusOK}}
		rec := &ex.recorder
		defer a.served(m, r, rec, time.Now(), &ex.request.principal.Subject)
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			rec.Header().Set("Allow", "GET, HEAD")
			writeProblem(rec, problem{Status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed, Detail: "the read API answers GET and HEAD only"})
			return
		}
		// A GET has no body: one is refused rather than left unread on
		// the connection.
		if r.ContentLength != 0 {
			writeProblem(rec, problem{Status: http.StatusBadRequest, Code: CodeBodyNotAllowed, Detail: "a request to the read API has no body"})
			return
		}
		if name == routeOther || name == routeOpenAPI {
			h(rec, r, nil)
			return
		}
		p, err := a.cfg.Authenticator.Authenticate(r)
		if err != nil {
			if errors.Is(err, auth.ErrUnauthenticated) {
				writeProblem(rec, problem{Status: http.StatusUnauthorized, Code: CodeUnauthenticated, Detail: "a valid bearer token is required"})
				return
			}
			a.heard.failure(r.Context(), whatAuthenticating, err)
			writeProblem(rec, problem{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the request could not be authenticated now"})
			return
		}
		a.heard.success(r.Context(), whatAuthenticating)
		ex.request.principal = p
		name := r.PathValue("name")
		v, ok := a.views[name]
		if !ok {
			writeProblem(rec, problem{Status: http.StatusNotFound, Code: CodeNotFound, Detail: fmt.Sprintf("no projection %q", name)})
			return
		}
		if !p.Allows(v.scope) {
			writeProblem(rec, problem{Status: http.StatusForbidden, Code: CodeForbidden, Detail: fmt.Sprintf("reading projection %q needs scope %s", name, v.scope)})
			return
		}
		ex.request.view = v
		h(rec, r, &ex.request)
	})
}

// exchange is what the API keeps of a request while it answers it.
type exchange struct {
	recorder recorder
	request  request
}

// served counts a request answered, under route m, and writes its access
// log line; subject is who asked, "" when nobody was authenticated.
func (a *API) served(m *routeMetrics, r *http.Request, rec *recorder, began time.Time, subject *string) {
	took := time.Since(began)
	m.observe(rec.status, took)
	if !a.log.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	a.log.LogAttrs(r.Context(), slog.LevelInfo, "http request",
		slog.String("method", r.Method), slog.String("route", m.route), slog.String("path", r.URL.Path),
		slog.String("query", r.URL.RawQuery), slog.Int("status", rec.status), slog.Int64("bytes", rec.bytes),
		slog.Float64("duration_ms", float64(took.Microseconds())/1000), slog.String("subject", *subject),
		slog.String("remote", r.RemoteAddr))
}

// recorder keeps the status and size of a response for the metrics and
// the access log.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// tenantOf is the tenant whose rows r's principal may read in v: "" for
// every row.
func (r *request) tenant() string {
	if r.view.p.Tenant == "" {
		return ""
	}
	return r.principal.Tenant
}

// table is what the API reads of a projection's table: its columns, and
// the statements built from them once rather than for each request.
type table struct {
	cols []column
	// get and getTenant read a row by key ($1), and by key and tenant
	// ($2).
	get, getTenant string
	// getMany and getManyTenant read the rows of keys ($1, text[]), each
	// with the key asked for after its columns; "" when the table has a
	// column of the name they give the keys.
	getMany, getManyTenant string
}

// columns returns v's columns, read from the table the first time it
// exists.
func (v *view) columns(ctx context.Context, q Querier) (*table, error) {
	if t := v.cols.Load(); t != nil {
		return t, nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if t := v.cols.Load(); t != nil {
		return t, nil
	}
	cols, err := tableColumns(ctx, q, v.p)
	if err != nil {
		return nil, err
	}
	t := &table{cols: cols}
	t.get = "SELECT " + selectList(cols) + " FROM " + quoteTable(v.p.Table) + " WHERE " + pgx.Identifier{v.p.KeyColumn}.Sanitize() + " = $1"
	if v.p.Tenant != "" {
		t.getTenant = t.get + " AND " + pgx.Identifier{v.p.Tenant}.Sanitize() + " = $2 AND " + tenantProbe(v.p, "$1")
	}
	t.getMany, t.getManyTenant = getManySQL(v.p, cols)
	v.cols.Store(t)
	return t, nil
}

// tenantProbe is the condition that the row of key (an SQL expression)
// is tenant $2's, answered by the engine's index on the tenant and key
// columns alone, so that another tenant's row is never read: the
// statement reads a row only once it holds. Without it PostgreSQL may
// probe the primary key, read another tenant's row from the table and
// drop it, a page more than for a key no row has, which a client can
// time. An index-only probe costs the planner less than that read
// whenever the table's visibility map has a few pages marked (vacuumed
// once); it reads the table only for a row of the tenant.
func tenantProbe(p *projection.Projection, key string) string {
	return "EXISTS (SELECT FROM " + quoteTable(p.Table) + " projector_probe WHERE projector_probe." + pgx.Identifier{p.Tenant}.Sanitize() +
		" = $2 AND projector_probe." + pgx.Identifier{p.KeyColumn}.Sanitize() + " = " + key + ")"
}

// forget drops the columns read, to be read again: the table may have
// changed (a rebuild's new generation).
func (v *view) forget() { v.cols.Store(nil) }

var errNoTable = errors.New("no table")

// selectList is the SELECT list of cols.
func selectList(cols []column) string {
	exprs := make([]string, len(cols))
	for i, c := range cols {
		exprs[i] = c.expr
	}
	return strings.Join(exprs, ", ")
}
