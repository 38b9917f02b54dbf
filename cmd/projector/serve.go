package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/stopsignal"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/readapi"
)

// The read API listens on a port of its own, apart from --http-addr's
// metrics and health: a Kubernetes Service or NetworkPolicy then exposes
// the API to other services without exposing /metrics, and probes and
// scrapes never queue behind API traffic.
const defaultAPIAddr = ":8081"

// apiFlags are the read API's flags, which serve and run --api share.
type apiFlags struct {
	addr             string
	auth             authFlags
	statementTimeout time.Duration
	// authn is the authenticator of the --auth flags, built by prepare.
	authn auth.Authenticator
}

func (a *apiFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.addr, "api-addr", defaultAPIAddr, "address of the read API (/v1/projections/...), apart from --http-addr's metrics and health so that the API can be exposed without them")
	a.auth.register(fs)
	fs.DurationVar(&a.statementTimeout, "api-statement-timeout", readapi.DefaultStatementTimeout, "longest one read API request's query runs before it is cancelled and answered 503")
}

func (a *apiFlags) validate() error {
	if a.addr == "" {
		return errors.New("--api-addr: an address is required, e.g. " + defaultAPIAddr)
	}
	if a.statementTimeout <= 0 {
		return fmt.Errorf("--api-statement-timeout %s: must be positive", a.statementTimeout)
	}
	return nil
}

// prepare builds the authenticator of the --auth flags, reading the
// files they name, so that a wrong one stops the command before it
// connects.
func (a *apiFlags) prepare(log *slog.Logger) error {
	authn, err := a.auth.authenticator(log)
	if err != nil {
		return err
	}
	a.authn = authn
	return nil
}

// listen binds --api-addr.
func (a *apiFlags) listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", a.addr)
	if err != nil {
		return nil, fmt.Errorf("--api-addr %s: %w", a.addr, err)
	}
	return ln, nil
}

// newAPI builds the read API of projs on pool, with its watcher of
// versions and staleness over identity's stored offsets; the watcher must
// run (serveAPI runs it) for min_version waits to end before their time.
func (a *apiFlags) newAPI(projs []*projection.Projection, pool *pgxpool.Pool, identity string, log *slog.Logger, reg prometheus.Registerer) (*readapi.API, *freshness.Watcher, error) {
	tenants := map[string]string{}
	for _, p := range projs {
		if p.Tenant != "" {
			tenants[p.Name] = p.Tenant
		}
	}
	w, err := freshness.NewWatcher(pool, projs, freshness.Config{
		Identity: identity, TenantColumns: tenants,
		Logger: log.With("component", "api"), Registerer: reg,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read API: %w", err)
	}
	api, err := readapi.New(readapi.Config{
		Projections: projs,
		// serve and run --api both mount the admin API beside it
		// (withAdmin): the document describes it.
		Admin:            true,
		DB:               pool,
		Authenticator:    a.authn,
		Staleness:        w,
		Waiter:           readapi.WatcherWaiter(w),
		StatementTimeout: a.statementTimeout,
		Logger:           log.With("component", "api"),
		Registerer:       reg,
	})
	if err != nil {
		return nil, nil, err
	}
	return api, w, nil
}

// serveAPI serves h on ln, with its watcher, until ctx ends, then lets
// the requests under way finish for up to 5 seconds.
func serveAPI(ctx context.Context, log *slog.Logger, ln net.Listener, h http.Handler, w *freshness.Watcher) error {
	g, gctx := errgroup.WithContext(ctx)
	wctx, stopWatcher := context.WithCancel(context.WithoutCancel(gctx))
	g.Go(func() error { return w.Run(wctx) })
	g.Go(func() error {
		// The watcher outlives the server's last request.
		defer stopWatcher()
		return serveHTTPAPI(gctx, log, ln, h)
	})
	return g.Wait()
}

// serveHTTPAPI serves h on ln until ctx ends, then lets the requests
// under way finish for up to 5 seconds.
func serveHTTPAPI(ctx context.Context, log *slog.Logger, ln net.Listener, h http.Handler) error {
	srv := readapi.NewServer(h)
	log.Info("serving the read API", "addr", ln.Addr().String())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("read API: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("read API: %w", serr)
	}
	return err
}

type serveFlags struct {
	common
	dbFlags
	api      apiFlags
	httpAddr string
}

func serveCommand(_, stderr io.Writer) *ffcli.Command {
	f := &serveFlags{}
	return newCommand("serve", "projector serve [flags]", "Serve the projections' rows over HTTP (the read API) from PostgreSQL alone, apart from the members that consume.", stderr,
		f.register,
		func(ctx context.Context, _ []string) error {
			return f.run(ctx, stderr)
		})
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	f.common.register(fs, "database-url", "identity", "config", "log")
	f.dbFlags.register(fs, "pool", "pooler", "startup")
	f.api.register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "address of /metrics, /livez, /readyz; empty disables")
}

// run serves the read API: it reads the projection file and connects,
// creating nothing; a projection whose table does not exist yet answers
// 503 until the engine creates it.
func (f *serveFlags) run(ctx context.Context, stderr io.Writer) error {
	if err := f.dbFlags.validate(); err != nil {
		return err
	}
	if err := f.api.validate(); err != nil {
		return err
	}
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	defer stopsignal.LogHangup(ctx, log)()
	if err := f.api.prepare(log); err != nil {
		return err
	}
	projs, err := projection.Load(f.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	poolCfg, err := f.dbFlags.poolConfig(f.database())
	if err != nil {
		return err
	}
	// The API only reads: a session that cannot write cannot be made
	// to by any bug, and PostgreSQL ends a statement past the timeout
	// even when the cancel request the driver sends is lost. A pooler
	// passes no such startup parameters on; there each request's
	// context cancels its query.
	if f.dbFlags.pooler == poolerNone {
		params := poolCfg.ConnConfig.RuntimeParams
		params["default_transaction_read_only"] = "on"
		params["statement_timeout"] = strconv.FormatInt(f.api.statementTimeout.Milliseconds(), 10) + "ms"
	}
	apiLn, err := f.api.listen()
	if err != nil {
		return err
	}
	defer apiLn.Close()
	ln, err := listen(f.httpAddr)
	if err != nil {
		return err
	}
	metrics := newRegistry()
	var (
		db       atomic.Pointer[pgxpool.Pool]
		starting starting
	)
	starting.step("connecting to PostgreSQL")
	ready := func(ctx context.Context) map[string]error {
		return starting.ready(ctx, func() readiness {
			if p := db.Load(); p != nil {
				return poolReadiness{p}
			}
			return nil
		})
	}
	su := newStartup(log, metrics, f.startupTimeout, defaultRetryBase, defaultRetryCap, &starting)
	return serveOn(ctx, log, ln, metrics, ready, nil, func(ctx context.Context) error {
		sctx, cancel := su.bound(ctx)
		defer cancel()
		pool, target, err := openDatabase(sctx, poolCfg, su, false)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return err
		}
		defer pool.Close()
		if err := su.do(sctx, "connect", func(ctx context.Context) error { return f.dbFlags.checkPooler(ctx, pool, "serve", log) }); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		api, watcher, err := f.api.newAPI(projs, pool, f.identity, log, metrics)
		if err != nil {
			return err
		}
		// The admin API writes: a pool of its own, small, without the
		// read pool's read-only setting, so that no read ever runs on a
		// session that can write.
		adminPool, err := pgxpool.NewWithConfig(sctx, adminPoolConfig(poolCfg))
		if err != nil {
			return fmt.Errorf("admin API: open its pool: %w", err)
		}
		defer adminPool.Close()
		// Without the brokers serve cannot plan an offset reset: those
		// answer 501, pointing at run --api and projector offsets reset.
		h, err := f.api.withAdmin(api, adminPool, f.identity, nil, log)
		if err != nil {
			return err
		}
		db.Store(pool)
		log.Info("read API reading PostgreSQL", append(target.attrs(), "max_conns", poolCfg.MaxConns, "projections", len(projs))...)
		return serveAPI(ctx, log, apiLn, h, watcher)
	})
}

// adminMaxConns bounds serve's admin pool: admin actions are rare, one
// request at a time is the common case.
const adminMaxConns = 2

// adminPoolConfig is the config of serve's admin pool: the read pool's
// without its read-only default.
func adminPoolConfig(read *pgxpool.Config) *pgxpool.Config {
	cfg := read.Copy()
	delete(cfg.ConnConfig.RuntimeParams, "default_transaction_read_only")
	cfg.MaxConns, cfg.MinConns = adminMaxConns, 0
	return cfg
}

// poolReadiness is serve's /readyz: PostgreSQL answers.
type poolReadiness struct{ pool *pgxpool.Pool }

func (p poolReadiness) Ready(ctx context.Context) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return map[string]error{"database": p.pool.Ping(ctx)}
}
