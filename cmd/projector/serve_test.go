package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeReadsWhatTheEngineWrote: a member started with --api and a
// projector serve process, each its own process, answer every row the
// engine wrote from a produced stream as the reference fold has it, and
// a deleted account is a 404.
func TestServeReadsWhatTheEngineWrote(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.Kafka(t, demo.Topic, 2)
	reg, regClient := testenv.Registry(t)
	enc, err := demo.RegisterSchemas(ctx, regClient)
	if err != nil {
		t.Fatal(err)
	}
	opts := demo.DefaultOptions()
	opts.Aggregates, opts.Seed = 200, 36
	records := demo.Generate(opts)
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := demo.Produce(ctx, prod, enc, records, nil); err != nil {
		t.Fatal(err)
	}
	end, err := demo.EndOffsets(ctx, kadm.NewClient(prod), demo.Topic)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "projections.yaml")
	file := bytes.Replace(demo.Projections, []byte("    mode: fold"), []byte("    filterable: [owner]\n    mode: fold"), 1)
	if err := os.WriteFile(config, file, 0o600); err != nil {
		t.Fatal(err)
	}

	runAPI := freeAddr(t)
	engine := startChild(t, "run",
		"--brokers", cluster.ListenAddrs()[0],
		"--registry-url", reg.URL(),
		"--database-url", db.URL,
		"--identity", "serve-test",
		"--config", config,
		"--http-addr", "",
		"--api", "--auth", "none", "--api-addr", runAPI,
		"--log-level", "warn",
	)
	testenv.WaitFor(t, 60*time.Second, func() error {
		select {
		case err := <-engine.done:
			t.Fatalf("projector run exited early: %v\n%s", err, engine.stderr)
		default:
		}
		var behind int64
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::bigint[]) WITH ORDINALITY e(end_offset, p)
			WHERE NOT EXISTS (SELECT FROM projector_offsets o WHERE o.identity = 'serve-test' AND o.topic = $2
				AND o.partition = e.p - 1 AND o.next_offset >= e.end_offset)`, []int64{end[0], end[1]}, demo.Topic).Scan(&behind); err != nil {
			return err
		}
		if behind > 0 {
			return fmt.Errorf("%d partitions not applied to their end", behind)
		}
		return nil
	})
	exp := demo.Fold(records)

	serveAPI, serveHTTP := freeAddr(t), freeAddr(t)
	srv := startChild(t, "serve",
		"--database-url", db.URL,
		"--identity", "serve-test",
		"--config", config,
		"--auth", "none",
		"--api-addr", serveAPI,
		"--http-addr", serveHTTP,
	)
	awaitServeReady(t, srv, serveHTTP)
	if !strings.Contains(srv.stderr.String(), "no authentication") {
		t.Errorf("--auth none logged no warning:\n%s", srv.stderr)
	}

	get := func(addr, path string) (int, http.Header, map[string]any) {
		t.Helper()
		return askJSON(ctx, t, http.MethodGet, "http://"+addr+path, "", "")
	}
	checked, deleted := 0, 0
	for id, want := range exp.Accounts {
		for _, addr := range []string{serveAPI, runAPI} {
			status, h, row := get(addr, "/v1/projections/accounts/rows/"+id)
			if status != http.StatusOK {
				t.Fatalf("account %s at %s: status %d %v", id, addr, status, row)
			}
			wantOpened := ""
			if !want.OpenedAt.IsZero() {
				wantOpened = want.OpenedAt.UTC().Format("2006-01-02T15:04:05.999999Z07:00")
			}
			opened, _ := row["opened_at"].(string)
			owner, _ := row["owner"].(string)
			if row["account_id"] != id || owner != want.Owner || row["balance"] != float64(want.Balance) || opened != wantOpened ||
				row["version"] != float64(want.Version) || h.Get("ETag") != fmt.Sprintf(`"%d"`, want.Version) {
				t.Errorf("account %s at %s: %v ETag %s, want owner %q balance %d opened %s version %d", id, addr, row, h.Get("ETag"), want.Owner, want.Balance, wantOpened, want.Version)
			}
		}
		checked++
	}
	for _, r := range records {
		if _, ok := exp.Accounts[r.Key]; ok || r.Key == "" {
			continue
		}
		if status, _, p := get(serveAPI, "/v1/projections/accounts/rows/"+r.Key); status != http.StatusNotFound || p["code"] != "not_found" {
			t.Errorf("account %s, without a row: status %d %v, want 404 not_found", r.Key, status, p)
		}
		deleted++
		break
	}
	if checked == 0 || deleted == 0 {
		t.Fatalf("checked %d rows and %d missing ones: the stream has too few", checked, deleted)
	}
	// A list filtered by owner: the reference fold's accounts of that
	// owner, in key order.
	var owner string
	for _, a := range exp.Accounts {
		owner = a.Owner
		break
	}
	status, _, list := get(serveAPI, "/v1/projections/accounts/rows?owner="+url.QueryEscape(owner)+"&limit=1000")
	if status != http.StatusOK {
		t.Fatalf("list by owner: %d %v", status, list)
	}
	wantN := 0
	for _, a := range exp.Accounts {
		if a.Owner == owner {
			wantN++
		}
	}
	if n := len(list["rows"].([]any)); n != wantN {
		t.Errorf("list by owner %q: %d rows, want %d", owner, n, wantN)
	}

	// Read-your-writes through the processes' watchers: a version the
	// row has is answered at once, with the partition's staleness (caught
	// up: 0); one it never reaches is version_not_reached once wait is
	// up, with the version it has.
	for id, want := range exp.Accounts {
		for _, addr := range []string{serveAPI, runAPI} {
			status, h, row := get(addr, fmt.Sprintf("/v1/projections/accounts/rows/%s?min_version=%d", id, want.Version))
			if status != http.StatusOK || row["version"] != float64(want.Version) {
				t.Errorf("account %s at %s, min_version %d: %d %v", id, addr, want.Version, status, row)
			}
			if s := h.Get("Projector-Staleness-Seconds"); s != "0.000" {
				t.Errorf("account %s at %s of a caught-up engine: Projector-Staleness-Seconds %q, want 0.000", id, addr, s)
			}
			status, _, p := get(addr, fmt.Sprintf("/v1/projections/accounts/rows/%s?min_version=%d&wait=1s", id, want.Version+1))
			if status != http.StatusPreconditionFailed || p["code"] != "version_not_reached" || p["current_version"] != float64(want.Version) {
				t.Errorf("account %s at %s, min_version %d it never reaches: %d %v, want 412 version_not_reached at %d", id, addr, want.Version+1, status, p, want.Version)
			}
		}
		break
	}

	// A deleted aggregate: waiting for its last version answers 404 with
	// that version, at once.
	var goneKey string
	var goneAt int64
	if err := db.Pool.QueryRow(ctx, `SELECT key, version FROM projector_tombstones WHERE table_name = 'accounts' ORDER BY key LIMIT 1`).Scan(&goneKey, &goneAt); err != nil {
		t.Fatalf("the stream deleted no account: %v", err)
	}
	for _, addr := range []string{serveAPI, runAPI} {
		status, _, p := get(addr, fmt.Sprintf("/v1/projections/accounts/rows/%s?min_version=%d&wait=10s", goneKey, goneAt))
		if status != http.StatusNotFound || p["code"] != "not_found" || p["current_version"] != float64(goneAt) {
			t.Errorf("account %s deleted at version %d, at %s with min_version %d: %d %v, want 404 at that version", goneKey, goneAt, addr, goneAt, status, p)
		}
	}

	resp, err := http.Get("http://" + serveHTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte(`projector_http_requests_total{code="200",route="/v1/projections/{name}/rows/{key}"}`)) {
		t.Errorf("serve's /metrics has no count of the rows it answered")
	}
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-srv.done:
		srv.done <- nil // for the cleanup
		if err != nil {
			t.Fatalf("serve did not exit cleanly on SIGTERM: %v\n%s", err, srv.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve still running 20s after SIGTERM")
	}
}

// awaitServeReady waits until the serve process srv answers /readyz on
// health, failing at once if it exits first.
func awaitServeReady(t *testing.T, srv *child, health string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, func() error {
		select {
		case err := <-srv.done:
			t.Fatalf("projector serve exited early: %v\n%s", err, srv.stderr)
		default:
		}
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %d", resp.StatusCode)
		}
		return nil
	})
}
