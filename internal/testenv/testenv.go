// Package testenv gives tests their real dependencies: a fresh Postgres
// schema on the test database, an in-process Kafka cluster (kfake) and an
// in-process Schema Registry (srfake). Each is torn down in t.Cleanup.
package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// DefaultDatabaseURL is the database tests use unless
// PROJECTOR_TEST_DATABASE_URL says otherwise.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DatabaseURL is the test database's URL.
func DatabaseURL() string {
	if u := os.Getenv("PROJECTOR_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultDatabaseURL
}

// DB is a fresh schema in the test database.
type DB struct {
	Pool   *pgxpool.Pool
	URL    string // connects with the schema as search_path
	Schema string
}

// NewDB creates a schema of its own for the test and a pool whose
// search_path is that schema; both go away when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	schema := fmt.Sprintf("t_%x", rand.Uint64())
	return fresh(t, "CREATE SCHEMA "+schema, "DROP SCHEMA "+schema+" CASCADE", schema, func(u *url.URL) {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
	})
}

// fresh runs create on the test database, and drop when the test ends,
// and returns a pool on the test database's URL as edit changes it.
func fresh(t testing.TB, create, drop, schema string, edit func(*url.URL)) *DB {
	t.Helper()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, DatabaseURL())
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(admin.Close)
	if err := admin.Ping(ctx); err != nil {
		t.Fatalf("test database %s is not reachable (start Postgres or set PROJECTOR_TEST_DATABASE_URL): %v", DatabaseURL(), err)
	}
	if _, err := admin.Exec(ctx, create); err != nil {
		t.Fatalf("%s: %v", create, err)
	}
	u, err := url.Parse(DatabaseURL())
	if err != nil {
		t.Fatalf("parse database url: %v", err)
	}
	edit(u)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		if _, err := admin.Exec(context.Background(), drop); err != nil {
			t.Errorf("%s: %v", drop, err)
		}
	})
	return &DB{Pool: pool, URL: u.String(), Schema: schema}
}

// Kafka starts an in-process Kafka cluster with the topic created with the
// given partition count.
func Kafka(t testing.TB, topic string, partitions int, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topic)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Registry starts an in-process Schema Registry and returns a client.
func Registry(t testing.TB) (*srfake.Registry, *sr.Client) {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatalf("registry client: %v", err)
	}
	return reg, cl
}

// RegistryEnv names the URL of a Confluent-compatible Schema Registry.
// When it is set, the tests that take their registry from NewRegistry use
// it instead of an in-process one.
const RegistryEnv = "PROJECTOR_TEST_REGISTRY_URL"

// SchemaRegistry is the Schema Registry of one test: in-process, or the
// one RegistryEnv names, shared by every test (which register under
// subjects of their own topics).
type SchemaRegistry struct {
	// Fake is the in-process registry, nil for a real one.
	Fake   *srfake.Registry
	Client *sr.Client
	URL    string
}

// NewRegistry gives the test its Schema Registry.
func NewRegistry(t testing.TB) *SchemaRegistry {
	t.Helper()
	if u := os.Getenv(RegistryEnv); u != "" {
		cl, err := sr.NewClient(sr.URLs(u))
		if err != nil {
			t.Fatalf("registry client for %s: %v", u, err)
		}
		if _, err := cl.Subjects(t.Context()); err != nil {
			t.Fatalf("the Schema Registry %s=%s does not answer: %v", RegistryEnv, u, err)
		}
		return &SchemaRegistry{Client: cl, URL: u}
	}
	fake, cl := Registry(t)
	return &SchemaRegistry{Fake: fake, Client: cl, URL: fake.URL()}
}
