package main

import (
	"flag"
	"testing"
	"time"
)

// TestSessionFlagsAndURL: a flag given explicitly wins over the URL's
// parameter, which wins over the flag's default.
func TestSessionFlagsAndURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		args     []string
		maxConns int32
		lock     string
		idle     string
		lifetime time.Duration
	}{
		{"postgres://h/db", nil, DefaultDatabaseMaxConns, "5000ms", "15000ms", DefaultDatabaseMaxConnLifetime},
		{"postgres://h/db?pool_max_conns=3&lock_timeout=1s&pool_max_conn_lifetime=1h", nil, 3, "1s", "15000ms", time.Hour},
		{"postgres://h/db?pool_max_conns=3&lock_timeout=1s&pool_max_conn_lifetime=1h", []string{"-database-max-conns", "7", "-database-lock-timeout", "2s", "-database-max-conn-lifetime", "5m"}, 7, "2000ms", "15000ms", 5 * time.Minute},
		{"host=h dbname=db pool_max_conns=4", []string{"-database-idle-in-transaction-timeout", "0"}, 4, "5000ms", "", DefaultDatabaseMaxConnLifetime},
	} {
		var d dbFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		d.register(fs, "pool", "sessions", "startup")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := d.poolConfig(dbSource{url: tc.url})
		if err != nil {
			t.Fatalf("%s %v: %v", tc.url, tc.args, err)
		}
		p := cfg.ConnConfig.RuntimeParams
		if cfg.MaxConns != tc.maxConns || p["lock_timeout"] != tc.lock || p["idle_in_transaction_session_timeout"] != tc.idle || p["application_name"] != "projector" {
			t.Errorf("%s %v: max conns %d, lock_timeout %q, idle_in_transaction_session_timeout %q, application_name %q; want %d, %q, %q, projector",
				tc.url, tc.args, cfg.MaxConns, p["lock_timeout"], p["idle_in_transaction_session_timeout"], p["application_name"], tc.maxConns, tc.lock, tc.idle)
		}
		if cfg.MaxConnLifetime != tc.lifetime {
			t.Errorf("%s %v: max conn lifetime %s, want %s", tc.url, tc.args, cfg.MaxConnLifetime, tc.lifetime)
		}
	}
}
