package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/rebuild"
)

const rebuildFile = `projections:
  - name: accounts
    topic: accounts.events
    table: accounts
    key: account_id
    mode: snapshot
    columns:
      account_id: {type: text, primary_key: true}
      owner: {type: text}
`

// rebuildFixture is a fresh identity whose projection accounts is at
// generation 1, with no replica running.
func rebuildFixture(t *testing.T) (*testenv.DB, *rebuild.Store, string) {
	t.Helper()
	db := testenv.NewDB(t)
	if err := rebuild.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	projs, err := projection.Parse([]byte(rebuildFile), "")
	if err != nil {
		t.Fatal(err)
	}
	identity := fmt.Sprintf("rebuild-cli-%x", rand.Uint64())
	store := rebuild.NewStore(db.Pool)
	if _, err := store.Ensure(t.Context(), identity, projs); err != nil {
		t.Fatal(err)
	}
	return db, store, identity
}

// TestRebuildCommands drives the rebuild commands against a database
// where no replica runs: a start stays accepted, a second one is refused
// naming it, status and list show it, cancel ends it, and rollback and
// cleanup say why there is nothing for them to do.
func TestRebuildCommands(t *testing.T) {
	ctx := t.Context()
	db, _, identity := rebuildFixture(t)
	projector := func(args ...string) (string, error) {
		t.Helper()
		var out, errs bytes.Buffer
		err := Main(ctx, append(append([]string{"rebuild"}, args...), "--database-url", db.URL), &out, &errs)
		return out.String(), err
	}
	withIdentity := func(args ...string) []string { return append(args, "--identity", identity) }

	out, err := projector(withIdentity("start", "--projection", "accounts", "--actor", "ann")...)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	id := regexp.MustCompile(`operation ([0-9a-f-]{36}) accepted`).FindStringSubmatch(out)
	if id == nil || !strings.Contains(out, "generation 1 → 2") || !strings.Contains(out, "projector rebuild status "+id[1]+" --watch") {
		t.Fatalf("start printed:\n%s", out)
	}
	opID := id[1]

	_, err = projector(withIdentity("start", "--projection", "accounts")...)
	if err == nil || exitCode(err) != exitFailed || !strings.Contains(err.Error(), opID) || !strings.Contains(err.Error(), rebuild.CodeInFlight) {
		t.Errorf("second start: %v (exit %d), want exit 1 naming %s", err, exitCode(err), opID)
	}

	out, err = projector("status", opID, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var op rebuild.Operation
	if err := json.Unmarshal([]byte(out), &op); err != nil || op.ID != opID || op.State != rebuild.StateAccepted || op.Actor != "ann" {
		t.Errorf("status --json: %v %+v\n%s", err, op, out)
	}
	out, err = projector(withIdentity("status")...)
	if err != nil || !strings.Contains(out, opID) || !regexp.MustCompile(`state\s+accepted`).MatchString(out) {
		t.Errorf("status of the operations in flight: %v\n%s", err, out)
	}

	out, err = projector(withIdentity("list")...)
	if err != nil || !regexp.MustCompile(opID+`\s+accounts\s+rebuild\s+1→2\s+accepted`).MatchString(out) {
		t.Errorf("list: %v\n%s", err, out)
	}

	out, err = projector("cancel", opID)
	if err != nil || !strings.Contains(out, "operation "+opID+" cancelled") {
		t.Errorf("cancel: %v\n%s", err, out)
	}
	_, err = projector("cancel", opID)
	if err == nil || !strings.Contains(err.Error(), "already ended") {
		t.Errorf("second cancel: %v, want already ended", err)
	}
	out, err = projector("status", opID)
	if err != nil || !regexp.MustCompile(`state\s+cancelled`).MatchString(out) || !strings.Contains(out, "cancelled by") {
		t.Errorf("status after cancel: %v\n%s", err, out)
	}
	// An ended operation is watched to its end at once: exit 1, it did
	// not complete.
	_, err = projector("status", opID, "--watch")
	if err == nil || exitCode(err) != exitFailed || !strings.Contains(err.Error(), "cancelled") {
		t.Errorf("status --watch of a cancelled operation: %v, want exit 1", err)
	}

	_, err = projector(withIdentity("rollback", "--projection", "accounts")...)
	if err == nil || !strings.Contains(err.Error(), "no retired generation") || !strings.Contains(err.Error(), rebuild.CodeNothingRetired) {
		t.Errorf("rollback without a retired generation: %v", err)
	}
	out, err = projector(withIdentity("cleanup", "--projection", "accounts")...)
	if err != nil || !strings.Contains(out, "nothing to drop") {
		t.Errorf("cleanup: %v\n%s", err, out)
	}
	_, err = projector(withIdentity("cleanup", "--projection", "orders")...)
	if err == nil || !strings.Contains(err.Error(), `"orders"`) {
		t.Errorf("cleanup of an unknown projection: %v", err)
	}
	_, err = projector(withIdentity("start", "--projection", "orders")...)
	if err == nil || !strings.Contains(err.Error(), rebuild.CodeUnknown) {
		t.Errorf("start of an unknown projection: %v", err)
	}
	_, err = projector("status", "nope")
	if exitCode(err) != exitUsage {
		t.Errorf("status of a bad id: %v (exit %d), want exit 2", err, exitCode(err))
	}
}

// TestRebuildStartWithConfig: --config takes the file's definition of the
// projection, and a definition naming another table is refused.
func TestRebuildStartWithConfig(t *testing.T) {
	ctx := t.Context()
	db, store, identity := rebuildFixture(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	renamed := write("renamed.yaml", strings.Replace(rebuildFile, "table: accounts", "table: accounts2", 1))
	added := write("added.yaml", rebuildFile+"      email: {type: text}\n")
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Main(ctx, append([]string{"rebuild", "start", "--projection", "accounts", "--identity", identity, "--database-url", db.URL}, args...), &out, io.Discard)
		return out.String(), err
	}
	if _, err := run("--config", renamed); err == nil || !strings.Contains(err.Error(), rebuild.CodeBadDefinition) {
		t.Errorf("a definition of another table: %v", err)
	}
	out, err := run("--config", added, "--json", "--retain", "2h")
	if err != nil {
		t.Fatal(err)
	}
	var op rebuild.Operation
	if err := json.Unmarshal([]byte(out), &op); err != nil || op.State != rebuild.StateAccepted || op.RetainSeconds != 7200 {
		t.Fatalf("start --json: %v %+v", err, op)
	}
	gs, err := store.Generations(ctx, identity)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 2 || gs[1].State != rebuild.Building || !strings.Contains(string(gs[1].Definition.YAML), "email") {
		t.Errorf("generations after start --config: %+v", gs)
	}
}
