package projector_test

import (
	"context"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultBundle is a bundle whose registry can be taken down.
type faultBundle struct {
	*bundle
	fake *srfake.Registry
	down atomic.Bool
}

func faultSetup(t *testing.T, opts demo.Options, partitions int) *faultBundle {
	t.Helper()
	ctx := context.Background()
	f := &faultBundle{bundle: &bundle{db: testenv.NewDB(t), kafka: testenv.Kafka(t, demo.Topic, partitions)}}
	f.fake, f.reg = testenv.Registry(t)
	f.fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		if f.down.Load() {
			http.Error(w, "registry unavailable", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	var err error
	if f.enc, err = demo.RegisterSchemas(ctx, f.reg); err != nil {
		t.Fatal(err)
	}
	if f.projs, err = projection.Parse(demo.Projections, "."); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, f.db.Pool, f.projs...); err != nil {
		t.Fatal(err)
	}
	f.records = demo.Generate(opts)
	return f
}

func (b *bundle) produce(t *testing.T, records []demo.Record) {
	t.Helper()
	ctx := context.Background()
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := demo.Produce(ctx, prod, b.enc, records, nil); err != nil {
		t.Fatal(err)
	}
	if b.end, err = demo.EndOffsets(ctx, kadm.NewClient(prod), demo.Topic); err != nil {
		t.Fatal(err)
	}
}

func deadLetters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM projector_dead_letters`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// fastRetry keeps backoffs short so fault tests heal quickly.
var fastRetry = partition.Config{RetryBase: 5 * time.Millisecond, RetryCap: 100 * time.Millisecond, ClassifyDecode: projector.ClassifyDecode}

// TestRegistryOutage takes the registry down before the member starts and
// again mid-stream, while records with a schema id it has not seen yet
// arrive: records must wait (retried, counted), never be dead-lettered,
// and apply once the registry is back.
func TestRegistryOutage(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 600
	f := faultSetup(t, opts, 3)
	half := len(f.records) / 2
	first := f.records[:half]
	for i := range first {
		first[i].Event.V2 = false // the second half brings the first v2 records
	}
	f.produce(t, first)

	f.down.Store(true)
	reg := prometheus.NewRegistry()
	e := f.engine(t, "outage", projector.Config{Partition: fastRetry, Registerer: reg})
	run(t, e)
	waitFor(t, "retries while the registry is down", 20*time.Second, func() bool {
		return counter(t, reg, "projector_retries_total") >= 10
	})
	if n := deadLetters(t, f.db.Pool); n != 0 {
		t.Fatalf("%d dead letters while the registry was down", n)
	}
	if n, _, err := demo.Committed(context.Background(), f.db.Pool, "outage", demo.Topic, f.end); err != nil || n != 0 {
		t.Fatalf("committed %d records while nothing could be decoded (err %v)", n, err)
	}
	f.down.Store(false)
	f.verifyPart(t, "outage", first)

	f.down.Store(true)
	retries := counter(t, reg, "projector_retries_total")
	f.produce(t, f.records[half:])
	waitFor(t, "retries in the second outage", 20*time.Second, func() bool {
		return counter(t, reg, "projector_retries_total") >= retries+10
	})
	f.down.Store(false)
	f.verify(t, "outage")
}

// verifyPart waits for the committed end and compares with the fold of
// records only.
func (b *bundle) verifyPart(t *testing.T, identity string, records []demo.Record) {
	t.Helper()
	all := b.records
	b.records = records
	defer func() { b.records = all }()
	b.verify(t, identity)
}

// TestPostgresConnectionsTerminated kills the member's Postgres
// connections over and over while it commits; batches retry and the table
// still equals the fold.
func TestPostgresConnectionsTerminated(t *testing.T) {
	ctx := context.Background()
	opts := demo.DefaultOptions()
	opts.Aggregates = 1500
	b := setup(t, opts, 3)

	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", "projector-victim-"+b.db.Schema)
	u.RawQuery = q.Encode()
	victim, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()

	reg := prometheus.NewRegistry()
	cfg := projector.Config{
		Brokers: b.kafka.ListenAddrs(), Identity: "terminated", Projections: b.projs,
		Partition: partition.Config{BatchMaxRecords: 100, RetryBase: 5 * time.Millisecond, RetryCap: 100 * time.Millisecond,
			ClassifyDecode: projector.ClassifyDecode},
		Registerer: reg,
	}
	reader := b.enc.ReaderSchema()
	e, err := projector.New(cfg, victim, func(*projection.Projection) partition.Decoder { return schemas.NewDecoder(b.reg, reader) })
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	killed := 0
	for killed < 30 {
		n, done, err := demo.Committed(ctx, b.db.Pool, "terminated", demo.Topic, b.end)
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		var k int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) t`,
			"projector-victim-"+b.db.Schema).Scan(&k); err != nil {
			t.Fatal(err)
		}
		killed += k
		_ = n
		time.Sleep(30 * time.Millisecond)
	}
	if killed == 0 {
		t.Fatal("no connection was terminated: the test did not inject the fault")
	}
	b.verify(t, "terminated")
	if counter(t, reg, "projector_retries_total") == 0 {
		t.Errorf("connections were terminated %d times but no batch was retried", killed)
	}
}
