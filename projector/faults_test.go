package projector_test

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

// faultBundle is a bundle whose registry can be taken down.
type faultBundle struct {
	*bundle
	fake *srfake.Registry
	down atomic.Bool
}

func faultSetup(t *testing.T, opts demo.Options, partitions int, cluster ...testenv.ClusterOpt) *faultBundle {
	t.Helper()
	ctx := t.Context()
	f := &faultBundle{bundle: &bundle{db: testenv.NewDB(t), kafka: testenv.NewCluster(t, demo.Topic, partitions, cluster...)}}
	reg := testenv.NewRegistry(t)
	f.fake, f.reg = reg.Fake, reg.Client
	if f.fake != nil { // a real registry cannot be taken down on cue
		f.fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
			if f.down.Load() {
				http.Error(w, "registry unavailable", http.StatusServiceUnavailable)
				return true
			}
			return false
		})
	}
	var err error
	if f.enc, err = demo.RegisterSchemasFor(ctx, f.reg, f.kafka.Topic); err != nil {
		t.Fatal(err)
	}
	if f.projs, err = projection.Parse(demo.Projections, "."); err != nil {
		t.Fatal(err)
	}
	for _, p := range f.projs {
		p.Topic = f.kafka.Topic
	}
	if err := postgres.Migrate(ctx, f.db.Pool, f.projs...); err != nil {
		t.Fatal(err)
	}
	f.records = demo.Generate(opts)
	return f
}

func (b *bundle) produce(t *testing.T, records []demo.Record) {
	t.Helper()
	ctx := t.Context()
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := demo.Produce(ctx, prod, b.enc, records, nil); err != nil {
		t.Fatal(err)
	}
	if b.end, err = demo.EndOffsets(ctx, kadm.NewClient(prod), b.kafka.Topic); err != nil {
		t.Fatal(err)
	}
}

func deadLetters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_dead_letters`).Scan(&n); err != nil {
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
	cfg := fastRetry
	cfg.UnreadyAfter = 200 * time.Millisecond
	e := f.engine(t, "outage", projector.Config{Partition: cfg, Registerer: reg})
	run(t, e)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("retries while the registry is down", func() bool {
		return counter(t, reg, "projector_retries_total") >= 10
	}))
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("/readyz to report the partitions backing off", func() bool {
		err := e.Ready(t.Context())["partitions"]
		return err != nil && strings.Contains(err.Error(), "backing off since")
	}))
	if got := gauge(t, reg, "projector_backoff_active"); got < 1 {
		t.Errorf("projector_backoff_active = %v while the registry is down, want at least 1", got)
	}
	if n := deadLetters(t, f.db.Pool); n != 0 {
		t.Fatalf("%d dead letters while the registry was down", n)
	}
	if n, _, err := demo.Committed(t.Context(), f.db.Pool, "outage", f.kafka.Topic, f.end); err != nil || n != 0 {
		t.Fatalf("committed %d records while nothing could be decoded (err %v)", n, err)
	}
	f.down.Store(false)
	f.verifyPart(t, "outage", first)

	f.down.Store(true)
	retries := counter(t, reg, "projector_retries_total")
	f.produce(t, f.records[half:])
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("retries in the second outage", func() bool {
		return counter(t, reg, "projector_retries_total") >= retries+10
	}))
	f.down.Store(false)
	f.verify(t, "outage")
}

// TestRegistryOutageDefaultClassifier leaves Partition.ClassifyDecode
// unset, as a library user would: the engine's own classifier must make
// records wait for the registry, not dead-letter them.
func TestRegistryOutageDefaultClassifier(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 200
	f := faultSetup(t, opts, 2)
	f.produce(t, f.records)
	f.down.Store(true)
	reg := prometheus.NewRegistry()
	e := f.engine(t, "outage-default", projector.Config{
		Partition:  partition.Config{RetryBase: 5 * time.Millisecond, RetryCap: 100 * time.Millisecond},
		Registerer: reg,
	})
	run(t, e)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("retries while the registry is down", func() bool {
		return counter(t, reg, "projector_retries_total") >= 10
	}))
	if n := deadLetters(t, f.db.Pool); n != 0 {
		t.Fatalf("%d dead letters while the registry was down", n)
	}
	f.down.Store(false)
	f.verify(t, "outage-default") // the fold's rows and dead letters, no more
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
	ctx := t.Context()
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
		Brokers: b.kafka.Addrs(), Identity: "terminated", Projections: b.projs,
		Partition: partition.Config{BatchMaxRecords: 100, RetryBase: 5 * time.Millisecond, RetryCap: 100 * time.Millisecond,
			ClassifyDecode: projector.ClassifyDecode},
		Registerer: reg,
	}
	reader := b.enc.ReaderSchema()
	cfg.Store = postgres.NewStore(victim)
	e, err := projector.New(cfg, func(*projection.Projection) partition.Decoder { return schemas.NewDecoder(b.reg, reader) })
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	// The victim's connections are terminated whenever it made progress
	// since the last time, so the faults spread over the stream.
	killed, last := 0, int64(-1)
	testenv.WaitFor(t, 2*time.Minute, func() error {
		n, done, err := demo.Committed(ctx, b.db.Pool, "terminated", b.kafka.Topic, b.end)
		if err != nil {
			t.Fatal(err)
		}
		if done || killed >= 30 {
			return nil
		}
		if n != last {
			last = n
			var k int
			if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) t`,
				"projector-victim-"+b.db.Schema).Scan(&k); err != nil {
				t.Fatal(err)
			}
			killed += k
		}
		return fmt.Errorf("%d records committed, %d connections terminated", n, killed)
	})
	if killed == 0 {
		t.Fatal("no connection was terminated: the test did not inject the fault")
	}
	b.verify(t, "terminated")
	if counter(t, reg, "projector_retries_total") == 0 {
		t.Errorf("connections were terminated %d times but no batch was retried", killed)
	}
}

// TestPoisonKinds mixes into a normal stream a row Postgres refuses (an
// index entry too large, SQLSTATE 54000), a record over the size limit,
// and a record whose schema id is registered only after the member first
// failed to find it. The refused and oversized events are dead-lettered
// with their class (their successors park); the late schema applies; the
// rest of each batch commits untouched.
func TestPoisonKinds(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 500
	f := faultSetup(t, opts, 2)
	if _, err := f.db.Pool.Exec(ctx, `CREATE INDEX accounts_owner ON accounts (owner)`); err != nil {
		t.Fatal(err)
	}
	f.produce(t, f.records)

	v1 := f.enc.ReaderSchema()
	encode := func(id int, ev demo.Event) []byte {
		t.Helper()
		b, err := schemas.AppendWire(nil, id, v1, map[string]any{
			"account_id": ev.AccountID, "version": ev.Version, "type": ev.Type, "owner": ev.Owner,
			"amount": ev.Amount, "occurred_at": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	random := func(n int) string { // incompressible, so Postgres cannot shrink the index entry
		b := make([]byte, n/2)
		if _, err := cryptorand.Read(b); err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(b)
	}
	ids, err := f.reg.SchemaByVersion(ctx, f.kafka.Topic+"-value", 1)
	if err != nil {
		t.Fatal(err)
	}
	const lateID = 900
	// A writer schema the projection cannot resolve: version is a string.
	other := `{"type":"record","name":"AccountEvent","namespace":"demo.accounts","fields":[
		{"name":"account_id","type":"string"},{"name":"version","type":"string"}]}`
	otherIDs, err := schemas.Register(ctx, f.reg, "other-value", other)
	if err != nil {
		t.Fatal(err)
	}
	otherSchema, err := schemas.ReaderSchema(ctx, f.reg, other, "")
	if err != nil {
		t.Fatal(err)
	}
	unresolvable, err := schemas.AppendWire(nil, otherIDs[0], otherSchema, map[string]any{"account_id": "bad-schema-1", "version": "one"})
	if err != nil {
		t.Fatal(err)
	}
	extra := []*kgo.Record{
		{Key: []byte("bad-schema-1"), Value: unresolvable},
		{Key: []byte("huge-1"), Value: encode(ids.ID, demo.Event{AccountID: "huge-1", Version: 1, Type: "AccountOpened", Owner: random(12000)})},
		{Key: []byte("huge-1"), Value: encode(ids.ID, demo.Event{AccountID: "huge-1", Version: 2, Type: "Deposited", Amount: 5})},
		{Key: []byte("big-1"), Value: encode(ids.ID, demo.Event{AccountID: "big-1", Version: 1, Type: "AccountOpened", Owner: random(30000)})},
		{Key: []byte("late-1"), Value: encode(lateID, demo.Event{AccountID: "late-1", Version: 1, Type: "AccountOpened", Owner: "late owner"})},
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(f.kafka.Addrs()...), kgo.DefaultProduceTopic(f.kafka.Topic), kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.ProduceSync(ctx, extra...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if f.end, err = demo.EndOffsets(ctx, kadm.NewClient(prod), f.kafka.Topic); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.MaxRecordBytes, cfg.MaxAttempts = 20_000, 20
	run(t, f.engine(t, "poison", projector.Config{Partition: cfg, Registerer: reg}))
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("a retry for the unknown schema id", func() bool {
		return counter(t, reg, "projector_retries_total") > 0
	}))
	f.fake.SeedSchema(f.kafka.Topic+"-value", 99, lateID, ids.Schema)

	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, f.db.Pool, "poison", f.kafka.Topic, f.end, nil); err != nil {
		t.Fatal(err)
	}
	exp := demo.Fold(f.records)
	exp.Accounts["late-1"] = demo.Account{Owner: "late owner", OpenedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Version: 1}
	if err := demo.Verify(ctx, f.db.Pool, demo.Table, exp); err != nil {
		t.Fatal(err)
	}
	classes := map[string]string{}
	rows, err := f.db.Pool.Query(ctx, `SELECT convert_from(record_key, 'UTF8'), error_class FROM projector_dead_letters
		WHERE record_key IN ('huge-1', 'big-1', 'late-1', 'bad-schema-1') ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, c string
		if err := rows.Scan(&k, &c); err != nil {
			t.Fatal(err)
		}
		classes[k] += c + " "
	}
	// huge-1 v2 shares the refused row when it is in the same batch as v1
	// (then it is dead-lettered with it), else it parks behind v1.
	var parked int
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE key = 'huge-1' AND version = 2`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	wantHuge := "rejected rejected "
	if parked == 1 {
		wantHuge = "rejected "
	}
	if classes["huge-1"] != wantHuge || classes["big-1"] != "oversized " || classes["late-1"] != "" || classes["bad-schema-1"] != "decode " {
		t.Errorf("dead letters by key: %q, want huge-1 %q, big-1 oversized, bad-schema-1 decode, late-1 none (huge-1 v2 parked: %d)", classes, wantHuge, parked)
	}
	if n, want := deadLetters(t, f.db.Pool), exp.Poison+2+len(strings.Fields(wantHuge)); n != want {
		t.Errorf("dead letters: %d, want %d", n, want)
	}
}

// TestParkedEventsSurviveRestart parks v3 behind a missing v2, restarts the
// member, then sends v2: v2 and v3 apply.
func TestParkedEventsSurviveRestart(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 50
	b := setup(t, opts, 2)
	ev := func(v int64, typ string, amount int64) demo.Record {
		return demo.Record{Key: "gap-1", Event: demo.Event{AccountID: "gap-1", Version: v, Type: typ, Owner: "o", Amount: amount}}
	}
	first := []demo.Record{ev(1, "AccountOpened", 0), ev(3, "Deposited", 30)}
	b.produce(t, first)
	b.records = append(b.records, first...)

	stop := run(t, b.engine(t, "restart", projector.Config{}))
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, b.db.Pool, "restart", b.kafka.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	stop()
	var parked int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE key = 'gap-1'`).Scan(&parked); err != nil || parked != 1 {
		t.Fatalf("gap-1 v3 parked %d times before the restart (err %v), want once", parked, err)
	}

	b.produce(t, []demo.Record{ev(2, "Deposited", 20)})
	b.records = append(b.records, ev(2, "Deposited", 20))
	run(t, b.engine(t, "restart", projector.Config{}))
	b.verify(t, "restart")
	var balance, version int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT balance, version FROM accounts WHERE account_id = 'gap-1'`).Scan(&balance, &version); err != nil {
		t.Fatal(err)
	}
	if balance != 50 || version != 3 {
		t.Errorf("gap-1: balance %d at v%d, want 50 at v3", balance, version)
	}
}

// TestOffsetLost deletes records beyond a partition's stored offset, as
// retention would, while no member runs. By default the partition halts,
// visibly; with OnOffsetLost skip it continues from the log start.
func TestOffsetLost(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 1)
	opened := func(from, to int) []demo.Record {
		var out []demo.Record
		for i := from; i < to; i++ {
			id := "lost-" + strconv.Itoa(i)
			out = append(out, demo.Record{Key: id, Event: demo.Event{AccountID: id, Version: 1, Type: "AccountOpened", Owner: "o"}})
		}
		return out
	}
	f.produce(t, opened(0, 10))
	f.records = opened(0, 10)
	stop := run(t, f.engine(t, "lost", projector.Config{}))
	f.verify(t, "lost")
	stop()

	f.produce(t, opened(10, 30))
	adm := kadm.NewClient(f.kafkaClient(t))
	var del kadm.Offsets
	del.Add(kadm.Offset{Topic: f.kafka.Topic, Partition: 0, At: 20})
	if _, err := adm.DeleteRecords(ctx, del); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	e := f.engine(t, "lost", projector.Config{Registerer: reg})
	stop = run(t, e)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("the partition to halt", func() bool {
		ws := e.Workers()
		return len(ws) == 1 && ws[0].Halted != ""
	}))
	if err := e.Ready(ctx)["partitions"]; err == nil || !strings.Contains(err.Error(), "halted") || !strings.Contains(err.Error(), "--on-offset-lost=skip") {
		t.Errorf("/readyz partitions check: %v, want it to say the partition halted and how to continue", err)
	}
	if got := gauge(t, reg, "projector_partition_halted"); got != 1 {
		t.Errorf("projector_partition_halted = %v, want 1", got)
	}
	if n, _, _ := demo.Committed(ctx, f.db.Pool, "lost", f.kafka.Topic, f.end); n != 10 {
		t.Errorf("a halted partition moved its offset to %d", n)
	}
	stop()

	run(t, f.engine(t, "lost", projector.Config{OnOffsetLost: projector.OffsetLostSkip}))
	f.records = append(opened(0, 10), opened(20, 30)...)
	f.verify(t, "lost")
}

func (b *bundle) kafkaClient(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 { return counter(t, g, name) }

// TestBrokerFetchErrors makes the broker fail every fetch of the topic for
// ten seconds mid-stream (NOT_LEADER_FOR_PARTITION, then
// REQUEST_TIMED_OUT): nothing may be dead-lettered or skipped, and after
// the broker heals the table equals the fold.
func TestBrokerFetchErrors(t *testing.T) {
	ctx := t.Context()
	opts := demo.DefaultOptions()
	opts.Aggregates = 800
	f := faultSetup(t, opts, 3)
	half := len(f.records) / 2
	f.produce(t, f.records[:half])

	e := f.engine(t, "broker", projector.Config{})
	run(t, e)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("some progress", func() bool {
		n, _, _ := demo.Committed(ctx, f.db.Pool, "broker", f.kafka.Topic, f.end)
		return n > 0
	}))
	heal := time.Now().Add(10 * time.Second)
	until := func(kmsg.Request) bool { return time.Now().Before(heal) }
	h := f.kafka.Fake.Fault(
		kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: f.kafka.Topic, Err: kerr.NotLeaderForPartition, Count: -1,
			When: func(r kmsg.Request) bool { return time.Now().Before(heal.Add(-5 * time.Second)) }},
		kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: f.kafka.Topic, Err: kerr.RequestTimedOut, Count: -1, When: until},
	)
	f.produce(t, f.records[half:])
	before, _, _ := demo.Committed(ctx, f.db.Pool, "broker", f.kafka.Topic, f.end)
	testenv.WaitFor(t, time.Minute, func() error {
		if left := time.Until(heal); left > 0 {
			return fmt.Errorf("the broker fails fetches for another %v", left)
		}
		return nil
	})
	h.Remove()
	if h.Hits() == 0 {
		t.Fatal("no fetch was faulted: the test injected nothing")
	}
	t.Logf("%d fetches faulted; %d records committed when the faults began", h.Hits(), before)
	f.verify(t, "broker")
}

// TestPostgresRestart restarts a private Postgres twice (fast shutdown:
// connections cut, open transactions rolled back) while batches commit.
func TestPostgresRestart(t *testing.T) {
	ctx := t.Context()
	srv := testenv.StartPostgres(t)
	opts := demo.DefaultOptions()
	opts.Aggregates = 1500
	f := faultSetup(t, opts, 3)
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool, f.projs...); err != nil {
		t.Fatal(err)
	}
	f.db = &testenv.DB{Pool: pool, URL: srv.URL}
	f.produce(t, f.records)

	reg := prometheus.NewRegistry()
	cfg := fastRetry
	cfg.BatchMaxRecords = 100
	run(t, f.engine(t, "restart", projector.Config{Partition: cfg, Registerer: reg}))
	total := int64(len(f.records))
	for i, at := range []int64{total / 4, total / 2} {
		testenv.WaitFor(t, time.Minute, testenv.Holds(fmt.Sprintf("%d records committed", at), func() bool {
			n, _, err := demo.Committed(ctx, pool, "restart", f.kafka.Topic, f.end)
			return err == nil && n >= at
		}))
		srv.Restart(t)
		t.Logf("restart %d after %d records", i+1, at)
	}
	f.verify(t, "restart")
	if counter(t, reg, "projector_retries_total") == 0 {
		t.Error("Postgres restarted twice but no batch was retried")
	}
}

// TestRevokeDuringBackoff revokes partitions from a member that is backing
// off (the registry is down) with long delays, under each group protocol:
// the revocation must not wait out the delay, so a joining member gets its
// partitions promptly.
func TestRevokeDuringBackoff(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) { revokeDuringBackoff(t, protocol) })
	}
}

func revokeDuringBackoff(t *testing.T, protocol string) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 200
	f := faultSetup(t, opts, 4, quickGroups)
	f.produce(t, f.records)
	f.down.Store(true)

	slow := partition.Config{RetryBase: 2 * time.Second, RetryCap: time.Minute, ClassifyDecode: projector.ClassifyDecode}
	regA := prometheus.NewRegistry()
	stopA := run(t, f.engine(t, "revoke", projector.Config{GroupProtocol: protocol, Partition: slow, RevokeTimeout: time.Minute, Registerer: regA}))
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("member a to back off with long delays", func() bool {
		return counter(t, regA, "projector_retries_total") >= 8 // two rounds per partition: delays now up to 8s
	}))
	b := f.engine(t, "revoke", projector.Config{GroupProtocol: protocol, Partition: slow, RevokeTimeout: time.Minute})
	joined := time.Now()
	stopB := run(t, b)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("member b to get partitions", func() bool { return len(b.Workers()) > 0 }))
	t.Logf("member b got partitions %.1fs after joining", time.Since(joined).Seconds())

	// Both back off for up to a minute now; a member with short delays
	// finishes the stream once the registry is back.
	stopA()
	stopB()
	f.down.Store(false)
	run(t, f.engine(t, "revoke", projector.Config{GroupProtocol: protocol, Partition: fastRetry}))
	f.verify(t, "revoke")
}
