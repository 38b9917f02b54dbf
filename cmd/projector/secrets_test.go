package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks/postgres"
)

// secret is the password every case below hands a command; it must never
// come out of one.
const secret = "Hunter2-p4ss"

// lockedBuffer is a buffer a command's goroutines may write to while the
// test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runCaptured runs projector with args and returns all it said: stdout,
// stderr and the error it ended with.
func runCaptured(ctx context.Context, args ...string) (all string, err error) {
	var out, errs lockedBuffer
	err = Main(ctx, args, &out, &errs)
	all = out.String() + errs.String()
	if err != nil {
		all += "\nprojector: " + err.Error()
	}
	return all, err
}

func noSecret(t *testing.T, what, output string) {
	t.Helper()
	if strings.Contains(output, secret) || strings.Contains(output, url.QueryEscape(secret)) {
		t.Errorf("%s printed the password:\n%s", what, output)
	}
}

// TestSecretsNeverPrinted runs commands given a password (in
// --registry-url, in a --database-url URL's userinfo or query, in a
// keyword/value connection string), most of them failing, and greps all
// they print for it.
func TestSecretsNeverPrinted(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("run with the registry down at startup", func(t *testing.T) {
		db := testenv.NewDB(t)
		kafka := testenv.Kafka(t, demo.Topic, 2)
		out, err := runCaptured(t.Context(), "run", "--brokers", strings.Join(kafka.ListenAddrs(), ","),
			"--registry-url", "http://reader:"+secret+"@127.0.0.1:1", "--database-url", db.URL,
			"--config", config, "--http-addr", "", "--log-format", "text")
		if err == nil {
			t.Fatalf("run started with its registry down:\n%s", out)
		}
		noSecret(t, "run", out)
		if !strings.Contains(out, "127.0.0.1:1") {
			t.Errorf("the error does not say which registry failed:\n%s", out)
		}
	})

	t.Run("run during a registry outage", func(t *testing.T) {
		db := testenv.NewDB(t)
		kafka := testenv.Kafka(t, demo.Topic, 2)
		fake, reg := testenv.Registry(t)
		enc, err := demo.RegisterSchemas(t.Context(), reg)
		if err != nil {
			t.Fatal(err)
		}
		// Down: the connection is dropped, so the client fails with an
		// error that quotes the URL it asked.
		var down atomic.Bool
		fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
			if !down.Load() {
				return false
			}
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return true
		})
		u, _ := url.Parse(fake.URL())
		u.User = url.UserPassword("reader", secret)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var out, errs lockedBuffer
		done := make(chan error, 1)
		go func() {
			done <- Main(ctx, []string{"run", "--brokers", strings.Join(kafka.ListenAddrs(), ","),
				"--registry-url", u.String(), "--database-url", db.URL, "--config", config, "--http-addr", "",
				"--retry-base", "5ms", "--retry-cap", "20ms", "--log-format", "json", "--log-level", "debug"}, &out, &errs)
		}()
		testenv.WaitFor(t, time.Minute, func() error {
			if !strings.Contains(errs.String(), "projector running") {
				return fmt.Errorf("run has not started:\n%s", errs.String())
			}
			return nil
		})
		// Records arrive whose schemas the member has not fetched yet.
		down.Store(true)
		prod, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer prod.Close()
		if err := demo.Produce(t.Context(), prod, enc, smallStream(), nil); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, time.Minute, func() error {
			if n := strings.Count(errs.String(), "transient failure; retrying"); n < 3 {
				return fmt.Errorf("%d retry lines so far", n)
			}
			return nil
		})
		cancel()
		err = <-done
		all := out.String() + errs.String()
		if err != nil {
			all += "\nprojector: " + err.Error()
		}
		noSecret(t, "run", all)
	})

	t.Run("dlq show with the registry down", func(t *testing.T) {
		db := testenv.NewDB(t)
		if err := postgres.Migrate(t.Context(), db.Pool); err != nil {
			t.Fatal(err)
		}
		var id int64
		value := []byte{0, 0, 0, 0, 7, 2, 'x'} // wire format, schema id 7
		if err := db.Pool.QueryRow(t.Context(), `INSERT INTO projector_dead_letters
			(identity, projection, topic, partition, "offset", record_key, value, headers, error, error_class, status, first_seen, last_seen)
			VALUES ('i', 'accounts', 'accounts.events', 0, 1, 'acc-1', $1, '[]', $2, 'decode', 'open', now(), now()) RETURNING id`,
			value, `schema id 7: unable to GET "http://reader:`+secret+`@registry:8081/schemas/ids/7": EOF`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"dlq", "show", fmt.Sprint(id), "--registry-url", "http://reader:" + secret + "@127.0.0.1:1"},
			{"dlq", "show", fmt.Sprint(id), "--json", "--registry-url", "http://reader:" + secret + "@127.0.0.1:1"},
			{"dlq", "list"},
			{"dlq", "list", "--json"},
			{"dlq", "replay", "--id", fmt.Sprint(id)},
		} {
			out, err := runCaptured(t.Context(), append(args, "--database-url", db.URL)...)
			if err != nil {
				t.Errorf("%s: %v", strings.Join(args[:2], " "), err)
			}
			noSecret(t, strings.Join(args, " "), out)
		}
	})

	t.Run("Kafka SASL password", func(t *testing.T) {
		db := testenv.NewDB(t)
		// Given in the environment, as the flag's help advises; the
		// help, the configuration errors and the failures to connect
		// all leave it out.
		t.Setenv("PROJECTOR_KAFKA_SASL_PASSWORD", secret)
		for _, args := range [][]string{
			{"produce", "--help"},
			{"produce", "--brokers", "127.0.0.1:1", "--topic", "t", "--tombstone", "k", "--timeout", "2s", "--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u"},
			{"status", "--brokers", "127.0.0.1:1", "--database-url", db.URL, "--kafka-sasl-mechanism", "kerberos", "--kafka-sasl-username", "u"},
			{"relay", "--brokers", "127.0.0.1:1", "--database-url", db.URL, "--kafka-sasl-mechanism", "scram-sha-256"},
			{"offsets", "reset", "--brokers", "127.0.0.1:1", "--database-url", db.URL, "--topic", "t", "--to-earliest", "--kafka-tls-cert-file", "c.pem"},
		} {
			out, _ := runCaptured(t.Context(), args...)
			noSecret(t, strings.Join(args, " "), out)
		}
		out, _ := runCaptured(t.Context(), "produce", "--brokers", "127.0.0.1:1", "--topic", "t", "--tombstone", "k",
			"--timeout", "2s", "--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u", "--kafka-sasl-password", secret)
		noSecret(t, "produce with --kafka-sasl-password", out)
	})

	t.Run("demo", func(t *testing.T) {
		base, err := url.Parse(testenv.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		// The test database trusts every connection: the password is
		// sent, and ignored.
		withQuery := *base
		q := withQuery.Query()
		q.Set("password", secret)
		withQuery.RawQuery = q.Encode()
		withUser := *base
		withUser.User = url.UserPassword(base.User.Username(), secret)
		keyword := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable password=%s",
			base.Hostname(), base.Port(), base.User.Username(), strings.TrimPrefix(base.Path, "/"), secret)
		admin, err := pgxpool.New(t.Context(), testenv.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(admin.Close) // after the drops below: cleanups run last first
		for _, dsn := range []string{withQuery.String(), withUser.String(), keyword} {
			schema := fmt.Sprintf("t_demo_%x", rand.Uint32())
			t.Cleanup(func() {
				if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
					t.Errorf("drop schema %s: %v", schema, err)
				}
			})
			out, err := runCaptured(t.Context(), "demo", "--database-url", dsn, "--database-schema", schema, "--aggregates", "20", "--timeout", "1m")
			if err != nil {
				t.Errorf("demo: %v\n%s", err, out)
			}
			noSecret(t, "demo", out)
		}
		out, err := runCaptured(t.Context(), "demo", "--database-url", "postgres://postgres:"+secret+"@127.0.0.1:1/test?connect_timeout=2")
		if err == nil {
			t.Error("demo ran without a database")
		}
		noSecret(t, "demo", out)
	})

}

func smallStream() []demo.Record {
	o := demo.DefaultOptions()
	o.Aggregates = 5
	return demo.Generate(o)
}
