package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projection/check"
)

// checkDBTimeout bounds how long check waits for PostgreSQL before it
// gives up with errNotChecked, so that a CI job whose database is down
// fails in seconds rather than at the job's own timeout.
const checkDBTimeout = 10 * time.Second

type checkFlags struct {
	common
	db         dbFlags
	writers    string
	schemaFile string
	projection string
	noDatabase bool
}

func checkCommand(stdout, stderr io.Writer) *ffcli.Command {
	f := &checkFlags{}
	return newCommand("check", "projector check --config FILE [--schema-file NEW.avsc --projection NAME] [flags]",
		"Prove a projection file against the Schema Registry and PostgreSQL without writing anything: one line per problem, exit status 1 if any, 3 if PostgreSQL or the registry could not be asked (--no-database checks without PostgreSQL).", stderr,
		func(fs *flag.FlagSet) {
			f.common.register(fs, "registry-url", "database-url", "config", "log")
			f.db.register(fs)
			fs.StringVar(&f.writers, "writers", check.WritersAll, "which registered writer versions each reader schema must read: all, or latest")
			fs.StringVar(&f.schemaFile, "schema-file", "", "prove this writer schema (.avsc) instead of the registered ones: can --projection read events written with it?")
			fs.StringVar(&f.projection, "projection", "", "check only this projection; required with --schema-file when the file has several")
			fs.BoolVar(&f.noDatabase, "no-database", false, "skip the PostgreSQL checks (column types, defaults, existing tables), as an empty --database-url does")
		},
		func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unexpected arguments %q: check takes only flags", args)
			}
			return f.run(ctx, stdout, stderr)
		})
}

// errCheckFailed is what check returns when it found problems, which it
// has printed already.
var errCheckFailed = errors.New("check found problems")

// errNotChecked is what check returns when it could not ask PostgreSQL or
// the registry: nothing it would have proved was proved, which a CI job
// must not take for a pass, nor for problems in the file (exit status
// exitNotChecked).
var errNotChecked = errors.New("could not check")

func (f *checkFlags) run(ctx context.Context, stdout, stderr io.Writer) error {
	if f.writers != check.WritersAll && f.writers != check.WritersLatest {
		return fmt.Errorf("--writers %q: want all or latest", f.writers)
	}
	if err := f.db.validate(); err != nil {
		return err
	}
	projs, err := projection.Load(f.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	if f.projection != "" {
		i := slices.IndexFunc(projs, func(p *projection.Projection) bool { return p.Name == f.projection })
		if i < 0 {
			return fmt.Errorf("--projection %q: %s defines no such projection", f.projection, f.config)
		}
		projs = projs[i : i+1]
	}
	cfg := check.Config{Projections: projs, Writers: f.writers}
	if f.schemaFile != "" {
		if len(projs) != 1 {
			return fmt.Errorf("--schema-file needs --projection: %s defines %d projections", f.config, len(projs))
		}
		b, _, err := readSchemaFile(f.schemaFile)
		if err != nil {
			return fmt.Errorf("--schema-file %w", err)
		}
		cfg.Writer, cfg.WriterName = string(b), filepath.Base(f.schemaFile)
	}
	if f.registryURL != "" {
		reg, err := f.registryClient()
		if err != nil {
			return err
		}
		cfg.Registry = reg
	}
	// Only --no-database or an empty --database-url skips PostgreSQL: a
	// database that was named but cannot be asked is not a pass.
	if !f.noDatabase && f.databaseURL != "" {
		pool, err := f.openPool(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		cfg.DB, cfg.RequireDB = pool, true
	}
	rep, err := check.Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errNotChecked, err)
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(stdout, "note:", redact.String(n))
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(stdout, redact.String(p.String()))
	}
	if len(rep.Problems) > 0 {
		return fmt.Errorf("%w: %d in %s", errCheckFailed, len(rep.Problems), f.config)
	}
	if cfg.Writer != "" {
		fmt.Fprintf(stdout, "projection %s can read events written with %s\n", projs[0].Name, cfg.WriterName)
		return nil
	}
	names := make([]string, len(projs))
	for i, p := range projs {
		names[i] = p.Name
	}
	fmt.Fprintf(stdout, "ok: %s\n", strings.Join(names, ", "))
	return nil
}

// openPool opens a pool on --database-url, or fails with errNotChecked
// when PostgreSQL does not answer within checkDBTimeout or refuses the
// session (no such database or role, a wrong password): the message says
// which, as run's does.
func (f *checkFlags) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := f.db.poolConfig(f.database())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, checkDBTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %w\nTo prove the file without PostgreSQL (column types, defaults and existing tables unproved), pass --no-database", errNotChecked, explain(targetOf(cfg), err))
	}
	return pool, nil
}
