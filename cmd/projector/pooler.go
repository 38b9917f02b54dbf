package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The values of --database-pooler: what --database-url leads to.
const (
	poolerNone        = "none"        // PostgreSQL itself
	poolerSession     = "session"     // a pool that gives each client a server session until it disconnects
	poolerTransaction = "transaction" // a pool that gives a client a server session for one transaction
)

// poolerModes are the values --database-pooler accepts.
var poolerModes = []string{poolerNone, poolerSession, poolerTransaction}

// forwarded are the startup parameters PgBouncer passes on to PostgreSQL
// and keeps per client; it refuses a connection that sends any other
// ("unsupported startup parameter"), or drops it unnoticed when told to
// ignore it.
var forwarded = map[string]bool{
	"application_name":            true,
	"client_encoding":             true,
	"datestyle":                   true,
	"timezone":                    true,
	"standard_conforming_strings": true,
}

// relayNeedsSession is the relay's refusal of transaction pooling: its
// shard and membership locks are session advisory locks, and its
// notifications arrive on the session that listens.
const relayNeedsSession = "projector relay needs session pooling for its advisory locks and LISTEN: point --database-url at PgBouncer's session pool (pool_mode = session) or directly at PostgreSQL"

// dlqNeedsSession is the refusal of a dead-letter topic behind
// transaction pooling: its publisher takes turns among the replicas by a
// session advisory lock, which a shared server session would keep after
// the unlock ran elsewhere, stopping every publisher.
const dlqNeedsSession = "publishing dead letters to a topic needs session pooling for its advisory lock (--database-pooler transaction): point --database-url at PgBouncer's session pool (pool_mode = session) or directly at PostgreSQL, or leave --dlq-topic unset"

// forPooler fits a parsed pool configuration to --database-pooler. The
// session settings (lock_timeout, idle_in_transaction_session_timeout,
// a search_path in the URL ...) cannot be startup parameters behind a
// pooler: a session pool gets them with SET once connected, the client
// holding its server session until it disconnects; a transaction pool
// cannot keep them for a client at all, and they are only checked once
// connected (checkPooler). A transaction pool also cannot keep pgx's
// named prepared statements from one transaction to the next, so its
// statements are sent unnamed.
func (d *dbFlags) forPooler(raw string, cfg *pgxpool.Config) error {
	params := cfg.ConnConfig.RuntimeParams
	d.settings = map[string]string{}
	for name, v := range params {
		if !forwarded[strings.ToLower(name)] {
			d.settings[name] = v
		}
	}
	if d.pooler == poolerNone {
		return nil
	}
	for name := range d.settings {
		delete(params, name)
	}
	switch d.pooler {
	case poolerSession:
		settings := maps.Clone(d.settings)
		if len(settings) > 0 {
			cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				return applySettings(ctx, conn, settings)
			}
		}
	case poolerTransaction:
		// Statements prepared by name (cache_statement, describe_exec)
		// stay on the server session of the transaction that prepared
		// them; exec and simple_protocol guess the parameters' types
		// from Go's, which cannot send the engine's array parameters.
		// cache_describe asks the server for the types once per client
		// connection and sends every statement unnamed.
		if mode := written(raw)["default_query_exec_mode"]; mode != "" && mode != "cache_describe" {
			return fmt.Errorf("--database-url: default_query_exec_mode=%s does not work behind transaction pooling (--database-pooler transaction), which uses cache_describe: remove it", mode)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	return nil
}

// applySettings sets each setting for the rest of conn's session. It
// prepares no statement by name: were the pool a transaction pool after
// all, the statement would outlive the client on a shared server session.
func applySettings(ctx context.Context, conn *pgx.Conn, settings map[string]string) error {
	names := slices.Sorted(maps.Keys(settings))
	values := make([]string, len(names))
	for i, n := range names {
		values[i] = settings[n]
	}
	if _, err := conn.Exec(ctx, `SELECT set_config(n, v, false) FROM unnest($1::text[], $2::text[]) AS s(n, v)`, pgx.QueryExecModeSimpleProtocol, names, values); err != nil {
		return fmt.Errorf("apply the session settings %s: %w", strings.Join(names, ", "), err)
	}
	return nil
}

// unsupportedParameter reports PgBouncer's refusal of a startup
// parameter it does not pass on, and names the parameter.
func unsupportedParameter(err error) (string, bool) {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "08P01" {
		return "", false
	}
	name, ok := strings.CutPrefix(pg.Message, "unsupported startup parameter: ")
	return name, ok
}

// explainUnsupported says what to do about a refused startup parameter.
func explainUnsupported(where, name string, err error) error {
	return fmt.Errorf("cannot connect to PostgreSQL at %s: a connection pooler such as PgBouncer is in between and refuses the session setting %s as a startup parameter: "+
		"say which pooling mode it runs with --database-pooler session or --database-pooler transaction (projector run, relay and migrate; other commands: remove the setting from --database-url): %w", where, name, err)
}

// checkPooler checks, once the pool answers, that --database-pooler
// says what --database-url leads to, for a command (its name) that
// relies on its sessions. It refuses transaction pooling that the flag
// does not name, and session settings that a pooler dropped; behind
// transaction pooling it refuses a search_path the server's sessions do
// not have and warns of other settings they lack.
func (d *dbFlags) checkPooler(ctx context.Context, pool *pgxpool.Pool, command string, log *slog.Logger) error {
	if d.pooler != poolerTransaction && pool.Config().MaxConns >= 2 {
		pooled, err := transactionPooled(ctx, pool)
		if err != nil {
			return fmt.Errorf("--database-pooler: probe the pooling: %w", err)
		}
		if pooled {
			if command == "relay" {
				return errors.New("--database-url leads through transaction pooling: " + relayNeedsSession)
			}
			return fmt.Errorf("--database-url leads through transaction pooling (two connections were served by one PostgreSQL session): "+
				"say --database-pooler transaction, or point --database-url at a session pool or directly at PostgreSQL (now --database-pooler %s)", d.pooler)
		}
	}
	if d.pooler == poolerSession || len(d.settings) == 0 {
		return nil // set after connecting, where the check above found a session of its own
	}
	have, want, err := sessionSettings(ctx, pool, d.settings)
	if err != nil {
		return fmt.Errorf("--database-pooler: read the session settings: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(d.settings)) {
		if have[name] == want[name] {
			continue
		}
		switch {
		case d.pooler == poolerNone:
			return fmt.Errorf("--database-url: PostgreSQL's sessions have %s %q, not the %q this command asked for when connecting: "+
				"a connection pooler dropped it (PgBouncer's ignore_startup_parameters); say --database-pooler session or --database-pooler transaction",
				name, have[name], want[name])
		case strings.EqualFold(name, "search_path"):
			return fmt.Errorf("--database-url: search_path %q cannot be set per connection behind transaction pooling, and the server's sessions have %q: "+
				"set it on the server (ALTER ROLE %s SET search_path = %s) and remove it from --database-url, or use a session pool",
				want[name], have[name], roleName(pool.Config().ConnConfig.User), d.settings[name])
		default:
			log.Warn("behind transaction pooling a session setting cannot be set per connection, and the server's sessions lack it: set it on the server for projector's user (ALTER ROLE ... SET), or use a session pool",
				"setting", name, "want", want[name], "have", have[name], "sql", fmt.Sprintf("ALTER ROLE %s SET %s = '%s'", roleName(pool.Config().ConnConfig.User), name, want[name]))
		}
	}
	return nil
}

// roleName is user as SQL writes it, quoted only where it must be.
func roleName(user string) string {
	if plainName.MatchString(user) {
		return user
	}
	return pgx.Identifier{user}.Sanitize()
}

var plainName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// transactionPooled reports whether two client connections held open at
// once were served by one PostgreSQL backend, which only transaction (or
// statement) pooling does: a session pool gives each client a backend of
// its own for as long as it is connected. A transaction pool hands the
// backend a client's statement just released to the next client
// (PgBouncer reuses the last released first), so the second connection's
// transaction finds the first's backend, or the first connection finds
// another backend afterwards. Other clients of the pool may hide it, never
// fake it.
func transactionPooled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer b.Release()
	// The simple protocol prepares nothing a shared backend would hold.
	const pidSQL = `SELECT pg_backend_pid()`
	var first, inTx, again int32
	if err := a.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&first); err != nil {
		return false, err
	}
	err = pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&inTx)
	})
	if err != nil {
		return false, err
	}
	if err := a.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&again); err != nil {
		return false, err
	}
	return first == inTx || first != again, nil
}

// sessionSettings returns, for each setting, what a session of pool has
// and what the wanted value reads as once set (PostgreSQL's own
// spelling, as "5s" for "5000ms"); it sets nothing that outlives its
// transaction.
func sessionSettings(ctx context.Context, pool *pgxpool.Pool, settings map[string]string) (have, want map[string]string, err error) {
	have, want = map[string]string{}, map[string]string{}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, name := range slices.Sorted(maps.Keys(settings)) {
			var h, w string
			if err := tx.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&h); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT set_config($1, $2, true)`, name, settings[name]).Scan(&w); err != nil {
				return err
			}
			have[name], want[name] = h, w
		}
		return errRollbackSettings
	})
	if errors.Is(err, errRollbackSettings) {
		err = nil
	}
	return have, want, err
}

// errRollbackSettings rolls back sessionSettings' transaction.
var errRollbackSettings = errors.New("roll back")
