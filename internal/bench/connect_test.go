package bench

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
)

func TestJDBCFromURL(t *testing.T) {
	for _, c := range []struct {
		in, url, user, password, schema string
	}{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&search_path=bench_1&application_name=bench_1",
			"jdbc:postgresql://127.0.0.1:5432/test?ApplicationName=bench_1&currentSchema=bench_1&sslmode=disable", "postgres", "", "bench_1"},
		{"postgresql://u:p%40ss@db.example:6543/app",
			"jdbc:postgresql://db.example:6543/app", "u", "p@ss", ""},
		{"postgres://u@[::1]/x", "jdbc:postgresql://[::1]:5432/x", "u", "", ""},
	} {
		got, err := jdbcFromURL(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if got.url != c.url || got.user != c.user || got.password != c.password || got.schema != c.schema {
			t.Errorf("%s: got %+v, want %s %s %s %s", c.in, got, c.url, c.user, c.password, c.schema)
		}
	}
	for _, bad := range []string{"host=127.0.0.1 dbname=test", "postgres://a,b/test", "mysql://x/y"} {
		if _, err := jdbcFromURL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestConnectNeedsBrokers checks that the Kafka Connect peer is refused
// on the embedded broker and left out of the default rows.
func TestConnectNeedsBrokers(t *testing.T) {
	spawn := func([]string) *exec.Cmd { return nil }
	c := Config{Events: 10, Partitions: 1, Modes: []string{ModeEngineFold, ModeConnectJDBC}, Spawn: spawn}
	if err := c.defaults(); err == nil || !strings.Contains(err.Error(), "needs --brokers") {
		t.Fatalf("connect-jdbc without brokers: %v, want it refused", err)
	}
	c = Config{Events: 10, Partitions: 1, Modes: []string{ModeEngineFold, ModeConnectJDBC}, Brokers: []string{"127.0.0.1:9092"}, Spawn: spawn}
	if err := c.defaults(); err != nil {
		t.Fatalf("connect-jdbc with brokers: %v", err)
	}
	for _, m := range AllModes {
		if m == ModeConnectJDBC {
			t.Fatalf("AllModes holds %s, which needs real Kafka", m)
		}
	}
}

func TestLastWriteWins(t *testing.T) {
	ev := func(key string, v int64) demo.Record {
		return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v}}
	}
	records := []demo.Record{
		ev("a", 1), ev("a", 2), ev("a", 3), // in order
		ev("b", 2), ev("b", 1), // overtaken
		ev("c", 1), ev("c", 2), ev("c", 1), // a stale copy last
		ev("d", 1), ev("d", 1), // a copy of the newest: right
	}
	if stale, reordered := lastWriteWins(records); stale != 1 || reordered != 1 {
		t.Fatalf("stale %d, reordered %d; want 1 and 1", stale, reordered)
	}
}
