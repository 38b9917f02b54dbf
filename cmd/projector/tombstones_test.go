package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks/postgres"
)

// tombstonesFile is a projection file of two projections, for the
// tombstones command's tests.
const tombstonesFile = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: snapshot
    columns:
      account_id: {type: text, primary_key: true}
      owner: {type: text}
  - name: orders
    topic: orders.events
    table: orders
    key: order_id
    mode: snapshot
    tombstone_retention: off
    columns:
      order_id: {type: text, primary_key: true}
`

// TestTombstonesForget: the command says what it would forget and changes
// nothing without --execute, also with PROJECTOR_EXECUTE set; with
// --execute it deletes that tombstone only; it refuses an aggregate whose
// row exists, keeping its row and tombstone, and names what it needs.
func TestTombstonesForget(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	file := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(file, []byte(tombstonesFile), 0o644); err != nil {
		t.Fatal(err)
	}
	projs, err := projection.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO projector_tombstones (table_name, key, version) VALUES ('accounts', 'gone', 3), ('accounts', 'kept', 2), ('orders', 'gone', 5), ('accounts', 'live', 1)`,
		`INSERT INTO accounts (account_id, owner, version) VALUES ('live', 'ann', 2)`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	tombstones := func() string {
		t.Helper()
		var keys []string
		if err := db.Pool.QueryRow(ctx, `SELECT array_agg(table_name || '/' || key ORDER BY table_name, key) FROM projector_tombstones`).Scan(&keys); err != nil {
			t.Fatal(err)
		}
		return strings.Join(keys, ",")
	}
	const all = "accounts/gone,accounts/kept,accounts/live,orders/gone"
	forget := func(args ...string) (string, error) {
		t.Helper()
		var out, errs bytes.Buffer
		err := Main(ctx, append([]string{"tombstones", "forget", "--config", file, "--database-url", db.URL}, args...), &out, &errs)
		return out.String(), err
	}

	out, err := forget("--projection", "accounts", "--key", "gone")
	if err != nil || !strings.Contains(out, `would forget the tombstone of key "gone" in table accounts (version 3`) || !strings.Contains(out, "dry run: nothing changed") {
		t.Errorf("dry run: %v\n%s", err, out)
	}
	t.Setenv("PROJECTOR_EXECUTE", "true")
	if out, err := forget("--projection", "accounts", "--key", "gone"); err != nil || !strings.Contains(out, "dry run") {
		t.Errorf("with PROJECTOR_EXECUTE=true and no --execute: %v\n%s", err, out)
	}
	if got := tombstones(); got != all {
		t.Fatalf("tombstones after dry runs: %s, want %s", got, all)
	}

	out, err = forget("--projection", "accounts", "--key", "gone", "--execute")
	if err != nil || !strings.Contains(out, `forgot the tombstone of key "gone" in table accounts`) {
		t.Errorf("--execute: %v\n%s", err, out)
	}
	if got, want := tombstones(), "accounts/kept,accounts/live,orders/gone"; got != want {
		t.Errorf("tombstones after forgetting accounts/gone: %s, want %s", got, want)
	}
	if out, err := forget("--projection", "accounts", "--key", "gone", "--execute"); err != nil || !strings.Contains(out, "nothing to forget") {
		t.Errorf("forgetting again: %v\n%s", err, out)
	}

	_, err = forget("--projection", "accounts", "--key", "live", "--execute")
	if err == nil || exitCode(err) != exitFailed || !strings.Contains(err.Error(), `key "live" has a row in table accounts`) || !strings.Contains(err.Error(), "delete event") {
		t.Errorf("forgetting a live aggregate: %v (exit %d), want a refusal saying it has a row", err, exitCode(err))
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE account_id = 'live'`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("live's row: %d, %v", rows, err)
	}
	if got, want := tombstones(), "accounts/kept,accounts/live,orders/gone"; got != want {
		t.Errorf("tombstones after the refusal: %s, want %s", got, want)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--key", "gone"}, "--projection is required"},
		{[]string{"--projection", "nope", "--key", "gone"}, `--projection "nope": no such projection`},
		{[]string{"--projection", "orders"}, "--key is required"},
	} {
		if _, err := forget(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("forget %v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestTombstoneRetentionFlag: --tombstone-retention defaults to the
// engine's 7 days, takes durations, days and off, and refuses 0, which
// would prune a tombstone as soon as it is written.
func TestTombstoneRetentionFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
		bad  bool
	}{
		{nil, 7 * 24 * time.Hour, false},
		{[]string{"--tombstone-retention", "30d"}, 30 * 24 * time.Hour, false},
		{[]string{"--tombstone-retention", "36h"}, 36 * time.Hour, false},
		{[]string{"--tombstone-retention", "off"}, -1, false},
		{[]string{"--tombstone-retention", "0"}, 0, true},
		{[]string{"--tombstone-retention", "-1h"}, 0, true},
		{[]string{"--tombstone-retention", "soon"}, 0, true},
	} {
		f := &runFlags{}
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(new(bytes.Buffer))
		f.register(fs)
		err := fs.Parse(tc.args)
		switch {
		case tc.bad && err == nil:
			t.Errorf("%v: accepted as %v", tc.args, time.Duration(f.tombstoneRetention))
		case !tc.bad && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case !tc.bad && time.Duration(f.tombstoneRetention) != tc.want:
			t.Errorf("%v: %v, want %v", tc.args, time.Duration(f.tombstoneRetention), tc.want)
		}
	}
	var out, errs bytes.Buffer
	err := Main(t.Context(), []string{"run", "--tombstone-retention", "0"}, &out, &errs)
	if exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--tombstone-retention") || !strings.Contains(err.Error(), "off") {
		t.Errorf("run --tombstone-retention 0: %v (exit %d), want a usage error naming the flag and off", err, exitCode(err))
	}
}
