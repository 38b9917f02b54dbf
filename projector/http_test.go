package projector_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestHTTPSurface checks health, readiness and the metric names a running
// member exports, and lints those names.
func TestHTTPSurface(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	b := setup(t, opts, 3)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewBuildInfoCollector())
	e := b.engine(t, "http", projector.Config{Registerer: reg})
	srv := httptest.NewServer(projector.Handler(reg, e.Ready, e.Live))
	defer srv.Close()

	// A member whose brokers cannot be reached never joins: not ready.
	lonely, err := projector.New(projector.Config{Brokers: []string{"127.0.0.1:1"}, Identity: "lonely", Projections: b.projs, Store: postgres.NewStore(b.db.Pool)},
		func(*projection.Projection) partition.Decoder { return nil })
	if err != nil {
		t.Fatal(err)
	}
	lonelySrv := httptest.NewServer(projector.Handler(prometheus.NewRegistry(), lonely.Ready, lonely.Live))
	defer lonelySrv.Close()
	if code, body := get(t, lonelySrv.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "group failed") {
		t.Errorf("/readyz of a member that has not joined: %d %q, want 503 naming the group check", code, body)
	}
	stopLonely := run(t, lonely)
	stopLonely()
	for _, path := range []string{"/livez", "/healthz"} {
		if code, _ := get(t, srv.URL+path); code != http.StatusOK {
			t.Errorf("%s: %d, want 200", path, code)
		}
	}
	run(t, e)
	b.verify(t, "http")

	testenv.WaitFor(t, 20*time.Second, func() error {
		code, body := get(t, srv.URL+"/readyz?verbose")
		if code != http.StatusOK {
			return fmt.Errorf("/readyz not ready: %d %q", code, body)
		}
		if !strings.Contains(body, "[+] group ok") || !strings.Contains(body, "[+] postgres ok") {
			t.Errorf("/readyz?verbose does not list its checks: %q", body)
		}
		return nil
	})

	// Caught up, the member's backlog drains at once; it says so from its
	// first look at the partitions.
	var metrics string
	testenv.WaitFor(t, 10*time.Second, func() error {
		_, metrics = get(t, srv.URL+"/metrics")
		if want := `projector_backlog_drain_seconds{group="http",topic="accounts.events"} 0`; !strings.Contains(metrics, want) {
			return fmt.Errorf("/metrics lacks %s", want)
		}
		return nil
	})
	for _, name := range []string{
		`projector_gap_timeout_seconds{group="http",projection="accounts"} 30`,
		`projector_consumer_lag{group="http",partition="0",topic="accounts.events"} 0`,
		`projector_consumer_lag_seconds{group="http",partition="0",topic="accounts.events"} 0`,
		`projector_rebalances_total{group="http"}`,
		`projector_partitions_assigned{group="http"} 3`,
		`projector_partitions_revoked_total{group="http"}`,
		`projector_partitions_lost_total{group="http"}`,
		`projector_last_rebalance_timestamp_seconds{group="http"}`,
		`projector_records_processed_total{group="http",outcome="applied",projection="accounts",topic="accounts.events"}`,
		`projector_records_processed_total{group="http",outcome="dead_lettered",projection="accounts",topic="accounts.events"}`,
		`projector_batch_commit_duration_seconds_bucket`,
		`projector_fenced_batches_total{group="http"} 0`,
		`projector_state_cache_entries{group="http",projection="accounts"}`,
		`projector_state_cache_bytes{group="http",projection="accounts"}`,
		`projector_state_cache_lookups_total{group="http",projection="accounts",result="hit"}`,
		`projector_state_cache_lookups_total{group="http",projection="accounts",result="miss"}`,
		`projector_tombstone_checks_total{check="filter",group="http",projection="accounts"}`,
		`projector_tombstone_checks_total{check="probe",group="http",projection="accounts"}`,
		`kgo_buffered_fetch_records_total`,
		`go_build_info`,
	} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	problems, err := promlint.New(strings.NewReader(metrics)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "kgo_") {
			continue // franz-go's own names, from its kprom plugin
		}
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}
