package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/testenv"
)

// schemathesisVenv is where CI installs schemathesis (.ci/run).
const schemathesisVenv = ".cache/schemathesis"

// Bounds of the fuzzing run: examples per operation, and a fixed seed so
// that a failure in CI is the same failure on a laptop.
const (
	schemathesisExamples = 100
	schemathesisSeed     = 36
)

// fuzzProjections has a column of each kind the read API writes, filters
// of several types, a text key that may hold a slash and a bigint key.
const fuzzProjections = `projections:
  - name: things
    topic: things
    table: things
    key: id
    mode: snapshot
    filterable: [label, qty, active, day]
    columns:
      id: {type: bigint, primary_key: true}
      label: {type: "varchar(20)"}
      qty: {type: integer}
      ratio: {type: double precision}
      price: {type: "numeric(10,2)"}
      active: {type: boolean}
      at: {type: "timestamptz(3)"}
      wall: {type: timestamp}
      day: {type: date}
      raw: {type: bytea}
      doc: {type: jsonb}
      tags: {type: "text[]"}
      grid: {type: "integer[]"}
      uid: {type: uuid}
  - name: notes
    topic: notes
    table: notes
    key: id
    mode: snapshot
    filterable: [author]
    columns:
      id: {type: text, primary_key: true}
      author: {type: text}
      body: {type: text}
`

// TestSchemathesis runs schemathesis, a property-based API fuzzer, with
// every check against projector serve over PostgreSQL rows of many
// types: no answer is a 5xx, and every status, content type, header and
// body is the one the document at /openapi.json gives. It needs
// schemathesis (in .cache/schemathesis, as CI installs it, or on PATH).
func TestSchemathesis(t *testing.T) {
	bin, err := exec.LookPath(filepath.Join(repoRoot, schemathesisVenv, "bin", "schemathesis"))
	if err != nil {
		if bin, err = exec.LookPath("schemathesis"); err != nil {
			t.Skip("schemathesis is not installed (see .ci/run): the read API is not fuzzed against its document")
		}
	}
	if bin, err = filepath.Abs(bin); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	db := testenv.NewDB(t)
	dir := t.TempDir()
	config := migrated(t, db, []byte(fuzzProjections))
	if _, err := db.Pool.Exec(ctx, `INSERT INTO things VALUES
		(1, 'one', 1, 0.5, 12.50, true, '2024-05-17 09:30:15.1+00', '2024-05-17 09:30:15.5', '2024-05-17', '\x00ff10', '{"a":[1,null]}', '{a,NULL}', '{{1,2},{3,4}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 2),
		(2, 'two', 2, 'NaN', 'NaN', false, 'infinity', '-infinity', '-infinity', '', 'null', '{}', '{}', NULL, 1),
		(3, NULL, NULL, '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1),
		(0, '', 0, 0, 0, true, '1970-01-01 00:00:00+00', '1970-01-01 00:00:00', '1970-01-01', '\x00', '0', '{""}', '{0}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a10', 1),
		(-1, 'neg', -1, -1e-300, -0.01, false, '0001-01-01 00:00:00+00', '294276-12-31 23:59:59.999999', '4713-01-01 BC', '\xff', '[]', '{"with space","{braces}"}', '{NULL}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', 9)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO notes VALUES ('a/b', 'ada', 'slash', 1), ('0', 'ada', NULL, 1), ('x y', NULL, '', 3)`); err != nil {
		t.Fatal(err)
	}
	tokenFile, tokens := writeTokens(t, tokenLine{"fuzzer", `scopes: ["read:*"]`})
	token := tokens["fuzzer"]

	api, health := freeAddr(t), freeAddr(t)
	srv := startChild(t, "serve", "--database-url", db.URL, "--config", config,
		"--auth", "tokens", "--auth-token-file", tokenFile, "--api-addr", api, "--http-addr", health)
	testenv.WaitFor(t, 30*time.Second, func() error {
		select {
		case err := <-srv.done:
			t.Fatalf("projector serve exited early: %v\n%s", err, srv.stderr)
		default:
		}
		resp, err := http.Get("http://" + api + "/openapi.json")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/openapi.json: %d", resp.StatusCode)
		}
		return nil
	})

	settings, err := filepath.Abs(filepath.Join(repoRoot, "readapi", "schemathesis.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--config-file", settings, "run", "http://"+api+"/openapi.json",
		"--checks", "all",
		"--header", "Authorization: Bearer "+token,
		"--max-examples", strconv.Itoa(schemathesisExamples),
		"--seed", strconv.Itoa(schemathesisSeed),
		// One worker: with two threads, Hypothesis describing its
		// strategies parses source concurrently, which Python 3.11's
		// parser is not safe for ("AST constructor recursion depth
		// mismatch"), failing the run on no fault of the API's.
		"--workers", "1",
		"--request-timeout", "40",
		"--report", "junit", "--report-dir", dir)
	// Its own files (a Hypothesis database) go to the temporary
	// directory, not the source tree.
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "SCHEMATHESIS_TELEMETRY=false")
	began := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("schemathesis ran for %s:\n%s", time.Since(began).Round(time.Second), summary(out))
	if err != nil {
		t.Fatalf("schemathesis: %v\n%s\nserve's log:\n%s", err, out, srv.stderr)
	}
}

// summary is schemathesis's summary: what it tested, without the
// progress lines before it.
func summary(out []byte) []byte {
	if i := bytes.LastIndex(out, []byte("SUMMARY")); i >= 0 {
		return out[i:]
	}
	return out
}
