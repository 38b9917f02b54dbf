package main

import (
	"flag"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestDatabasePoolerConfig: behind a pooler the session settings (the
// flags' and the URL's) leave the startup parameters, which PgBouncer
// would refuse, and application_name stays; a session pool sets them once
// connected, a transaction pool sends statements unnamed; bad values are
// refused naming the flag or the URL's parameter.
func TestDatabasePoolerConfig(t *testing.T) {
	const url = "postgres://h/db?search_path=app"
	settings := map[string]string{"lock_timeout": "5000ms", "idle_in_transaction_session_timeout": "15000ms", "search_path": "app"}
	for _, tc := range []struct {
		pooler       string
		url          string
		sent         []string // startup parameters besides application_name
		afterConnect bool
		mode         pgx.QueryExecMode
		err          string
	}{
		{pooler: "none", url: url, sent: []string{"lock_timeout", "idle_in_transaction_session_timeout", "search_path"}, mode: pgx.QueryExecModeCacheStatement},
		{pooler: "session", url: url, afterConnect: true, mode: pgx.QueryExecModeCacheStatement},
		{pooler: "transaction", url: url, mode: pgx.QueryExecModeCacheDescribe},
		{pooler: "transaction", url: url + "&default_query_exec_mode=cache_describe", mode: pgx.QueryExecModeCacheDescribe},
		{pooler: "transaction", url: url + "&default_query_exec_mode=cache_statement", err: "default_query_exec_mode=cache_statement does not work behind transaction pooling"},
		{pooler: "transaction", url: url + "&default_query_exec_mode=exec", err: "default_query_exec_mode=exec"},
		{pooler: "statement", url: url, err: `--database-pooler "statement": want none, session, transaction`},
	} {
		var d dbFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		d.register(fs, "pool", "sessions", "pooler", "startup")
		if err := fs.Parse([]string{"-database-pooler", tc.pooler}); err != nil {
			t.Fatal(err)
		}
		err := d.validate()
		if err == nil {
			var cfg *pgxpool.Config
			if cfg, err = d.poolConfig(dbSource{url: tc.url}); err == nil {
				p := cfg.ConnConfig.RuntimeParams
				if p["application_name"] != "projector" {
					t.Errorf("%s: application_name %q, want projector", tc.pooler, p["application_name"])
				}
				for name := range settings {
					if _, sent := p[name]; sent != slices.Contains(tc.sent, name) {
						t.Errorf("%s: %s sent as a startup parameter: %v, want %v", tc.pooler, name, sent, !sent)
					}
				}
				if !maps.Equal(d.settings, settings) {
					t.Errorf("%s: settings %v, want %v", tc.pooler, d.settings, settings)
				}
				if (cfg.AfterConnect != nil) != tc.afterConnect {
					t.Errorf("%s: sets the settings after connecting: %v, want %v", tc.pooler, cfg.AfterConnect != nil, tc.afterConnect)
				}
				if cfg.ConnConfig.DefaultQueryExecMode != tc.mode {
					t.Errorf("%s: query exec mode %v, want %v", tc.pooler, cfg.ConnConfig.DefaultQueryExecMode, tc.mode)
				}
			}
		}
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s %s: %v", tc.pooler, tc.url, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s %s: got error %v, want one saying %q", tc.pooler, tc.url, err, tc.err)
		}
	}
}
