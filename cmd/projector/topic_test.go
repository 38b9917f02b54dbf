package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// TestBadTopicRefused: a topic name Kafka would refuse, in a projection
// file or in a --topic flag, is refused before anything is written or
// asked of Kafka, naming the projection (or the flag) and quoting the
// topic; check counts it as a problem of the file (exit status 1).
func TestBadTopicRefused(t *testing.T) {
	const bad = "bad topic/../x"
	db := testenv.NewDB(t)
	config := filepath.Join(t.TempDir(), "bad.yaml")
	content := bytes.Replace(demo.Projections, []byte("topic: accounts.events"), []byte(`topic: "`+bad+`"`), 1)
	if bytes.Equal(content, demo.Projections) {
		t.Fatal("the demo projection file names another topic")
	}
	if err := os.WriteFile(config, content, 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := []string{`projection "accounts"`, `topic "` + bad + `"`, "not a topic name Kafka accepts"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"check", []string{"check", "--config", config, "--no-database"}, fromFile},
		{"check with a database", []string{"check", "--config", config, "--database-url", db.URL}, fromFile},
		{"run", []string{"run", "--config", config, "--brokers", "127.0.0.1:1", "--registry-url", "http://127.0.0.1:1", "--database-url", db.URL, "--http-addr", ""}, fromFile},
		{"dev", []string{"dev", "--config", config, "--database-url", db.URL, "--brokers-addr", "127.0.0.1:0", "--registry-addr", "127.0.0.1:0", "--http-addr", ""}, fromFile},
		{"run --dlq-topic", []string{"run", "--brokers", "127.0.0.1:1", "--registry-url", "http://127.0.0.1:1", "--database-url", db.URL, "--dlq-topic", bad}, []string{`--dlq-topic: topic "` + bad + `"`}},
		{"produce --topic", []string{"produce", "--brokers", "127.0.0.1:1", "--topic", bad}, []string{`--topic: topic "` + bad + `"`}},
		{"offsets reset --topic", []string{"offsets", "reset", "--brokers", "127.0.0.1:1", "--database-url", db.URL, "--topic", bad, "--to-earliest"}, []string{`--topic: topic "` + bad + `"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := Main(ctx, tc.args, &out, &out)
			if err == nil {
				t.Fatalf("%s succeeded:\n%s", tc.name, &out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q\n%s", err, w, &out)
				}
			}
			if got := exitCode(err); got != exitFailed {
				t.Errorf("exit status %d, want %d", got, exitFailed)
			}
		})
	}
	var tables int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d tables were created in the database: a bad topic must be refused before anything is written", tables)
	}
}
