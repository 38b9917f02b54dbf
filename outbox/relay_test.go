package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sr"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/schemas"
)

const topic = "accounts.events"

type env struct {
	db    *testenv.DB
	kafka *kfake.Cluster
	reg   *sr.Client
}

func setup(t *testing.T) *env {
	t.Helper()
	db := testenv.NewDB(t)
	if err := outbox.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if err := outbox.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	_, reg := testenv.Registry(t)
	if _, err := demo.RegisterSchemas(t.Context(), reg); err != nil {
		t.Fatal(err)
	}
	return &env{db: db, kafka: testenv.Kafka(t, topic, 4), reg: reg}
}

func (e *env) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.kafka.ListenAddrs()...), kgo.ProducerLinger(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// relay starts a relay; it stops when the test ends, or with the returned
// stop function.
func (e *env) relay(t *testing.T, cfg outbox.Config) (*outbox.Relay, *prometheus.Registry, func()) {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = e.client(t)
	}
	if cfg.Registry == nil {
		cfg.Registry = e.reg
	}
	reg := prometheus.NewRegistry()
	if cfg.Registerer == nil {
		cfg.Registerer = reg
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	r, err := outbox.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return r, reg, stop
}

// readAll returns every record of the topic, in offset order per
// partition.
func (e *env) readAll(t *testing.T) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	admin := kadm.NewClient(e.client(t))
	ends, err := admin.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil
	}
	cl := e.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading the topic: %v (left: %v)", err, want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok {
				out = append(out, r)
				if r.Offset+1 >= end {
					delete(want, r.Partition)
				}
			}
		})
	}
	return out
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func event(id string, version int64) outbox.Event {
	return outbox.Event{
		AggregateType: "account", AggregateID: id, Version: version, Type: "Deposited", Topic: topic,
		Value: map[string]any{"account_id": id, "version": version, "type": "Deposited", "amount": 10 * version, "occurred_at": time.Now()},
	}
}

func count(t *testing.T, e *env, where string) int {
	t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_outbox WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAtomicity: events appended in a transaction that rolls back leave no
// row and are never published; those of one that commits are.
func TestAtomicity(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	r, _, _ := e.relay(t, outbox.Config{PollInterval: 100 * time.Millisecond})
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the relay ready", func() bool {
		for _, err := range r.Ready(ctx) {
			if err != nil {
				return false
			}
		}
		return true
	}))

	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Append(ctx, tx, event("rolled-back", 1), event("rolled-back", 2)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e, "true"); n != 0 {
		t.Fatalf("%d rows after rollback, want 0", n)
	}
	err = pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		return outbox.Append(ctx, tx, event("committed", 1), event("committed", 2))
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("both committed events published", func() bool { return count(t, e, "published_at IS NOT NULL") == 2 }))
	recs := e.readAll(t)
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%s/%s", r.Key, mustHeader(t, r, outbox.HeaderCEType)))
	}
	if len(recs) != 2 || string(recs[0].Key) != "committed" || string(recs[1].Key) != "committed" {
		t.Fatalf("topic holds %v, want the two committed events only", got)
	}
	dec := schemas.NewDecoder(e.reg, nil)
	for i, r := range recs {
		v, _, err := dec.Decode(ctx, r.Value)
		if err != nil {
			t.Fatal(err)
		}
		if v["version"] != int64(i+1) || v["account_id"] != "committed" || v["amount"] != int64(10*(i+1)) {
			t.Errorf("record %d decodes to %v", i, v)
		}
	}
}

func mustHeader(t *testing.T, r *kgo.Record, key string) string {
	t.Helper()
	v, ok := header(r, key)
	if !ok {
		t.Errorf("record %s lacks header %q (has %v)", r.Key, key, r.Headers)
	}
	return v
}

// TestCloudEventsAndTrace checks a published record against the
// CloudEvents Kafka protocol binding (binary content mode): the required
// attributes ce_specversion "1.0", ce_id, ce_source (a non-empty
// URI-reference), ce_type, the optional ce_time (RFC 3339) and ce_subject,
// content-type; and that its traceparent carries the trace id of the
// context the event was appended with.
func TestCloudEventsAndTrace(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	e.relay(t, outbox.Config{PollInterval: 100 * time.Millisecond})

	traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled})
	tctx := trace.ContextWithSpanContext(ctx, sc)
	at := time.Date(2026, 5, 6, 7, 8, 9, 123456000, time.UTC)
	ev := event("acc-ce", 1)
	ev.Tenant, ev.Time, ev.Source, ev.ID = "tenant-a", at, "https://accounts.example/svc", "evt-1"
	plain := event("acc-ce-2", 1) // defaults: generated id, source, subject, time
	before := time.Now()
	if err := outbox.AppendPool(tctx, e.db.Pool, ev, plain); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("published", func() bool { return count(t, e, "published_at IS NOT NULL") == 2 }))
	recs := e.readAll(t)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for _, r := range recs {
		checkCloudEvent(t, r)
		tp := mustHeader(t, r, outbox.HeaderTraceparent)
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[0] != "00" || parts[1] != traceID.String() || parts[2] != "00f067aa0ba902b7" || parts[3] != "01" {
			t.Errorf("%s: traceparent %q, want trace id %s from the appending context", r.Key, tp, traceID)
		}
		if _, ok := header(r, outbox.HeaderTracestate); ok {
			t.Errorf("%s: tracestate header without a trace state", r.Key)
		}
		switch string(r.Key) {
		case "acc-ce":
			for k, want := range map[string]string{outbox.HeaderCEID: "evt-1", outbox.HeaderCESource: "https://accounts.example/svc",
				outbox.HeaderCESubject: "acc-ce", outbox.HeaderTenant: "tenant-a", outbox.HeaderCETime: "2026-05-06T07:08:09.123456Z"} {
				if got := mustHeader(t, r, k); got != want {
					t.Errorf("acc-ce: %s = %q, want %q", k, got, want)
				}
			}
		case "acc-ce-2":
			if _, ok := header(r, outbox.HeaderTenant); ok {
				t.Error("tenant header without a tenant")
			}
			if got := mustHeader(t, r, outbox.HeaderCESource); got != "/account" {
				t.Errorf("default ce_source %q, want /account", got)
			}
			if ts, _ := time.Parse(time.RFC3339, mustHeader(t, r, outbox.HeaderCETime)); ts.Before(before.Add(-time.Second)) || ts.After(time.Now()) {
				t.Errorf("default ce_time %v, want the append time", ts)
			}
		}
	}
	id1, id2 := mustHeader(t, recs[0], outbox.HeaderCEID), mustHeader(t, recs[1], outbox.HeaderCEID)
	if id1 == id2 {
		t.Errorf("two events share ce_id %q", id1)
	}

	// Without a span in the context: no trace headers at all.
	if err := outbox.AppendPool(ctx, e.db.Pool, event("acc-untraced", 1)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("published", func() bool { return count(t, e, "published_at IS NOT NULL") == 3 }))
	for _, r := range e.readAll(t) {
		if string(r.Key) == "acc-untraced" {
			checkCloudEvent(t, r)
			if tp, ok := header(r, outbox.HeaderTraceparent); ok {
				t.Errorf("untraced event has traceparent %q", tp)
			}
		}
	}
}

// checkCloudEvent checks the CloudEvents 1.0 Kafka binary-mode attributes
// strictly.
func checkCloudEvent(t *testing.T, r *kgo.Record) {
	t.Helper()
	seen := map[string]int{}
	for _, h := range r.Headers {
		seen[h.Key]++
		if strings.HasPrefix(h.Key, "ce_") && h.Key != strings.ToLower(h.Key) {
			t.Errorf("%s: attribute header %q is not lower case", r.Key, h.Key)
		}
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("%s: header %q appears %d times", r.Key, k, n)
		}
	}
	if v := mustHeader(t, r, outbox.HeaderCESpecVersion); v != "1.0" {
		t.Errorf("%s: ce_specversion %q, want 1.0", r.Key, v)
	}
	if v := mustHeader(t, r, outbox.HeaderCEID); v == "" {
		t.Errorf("%s: empty ce_id", r.Key)
	}
	if v := mustHeader(t, r, outbox.HeaderCEType); v == "" {
		t.Errorf("%s: empty ce_type", r.Key)
	}
	src := mustHeader(t, r, outbox.HeaderCESource)
	if u, err := url.Parse(src); src == "" || err != nil || strings.ContainsAny(src, " \t\n") {
		t.Errorf("%s: ce_source %q is not a non-empty URI-reference (%v, %v)", r.Key, src, u, err)
	}
	if v, ok := header(r, outbox.HeaderCETime); ok {
		if _, err := time.Parse(time.RFC3339, v); err != nil {
			t.Errorf("%s: ce_time %q is not RFC 3339: %v", r.Key, v, err)
		}
	}
	if v, ok := header(r, outbox.HeaderCESubject); ok && v == "" {
		t.Errorf("%s: empty ce_subject", r.Key)
	}
	if v := mustHeader(t, r, outbox.HeaderContentType); v != "application/avro" {
		t.Errorf("%s: content-type %q", r.Key, v)
	}
	if len(r.Value) < 5 || r.Value[0] != 0 {
		t.Errorf("%s: value is not in the Confluent wire format", r.Key)
	}
}

// TestNotifyLatency: with a 5s PollInterval, a committed event is
// published within a bound far below it, through LISTEN/NOTIFY.
func TestNotifyLatency(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	_, reg, _ := e.relay(t, outbox.Config{PollInterval: 5 * time.Second})
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the relay owns every shard", func() bool {
		return gauge(t, reg, "projector_outbox_shards_owned") == outbox.DefaultShards
	}))

	cl := e.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	seen := make(chan string, 1000)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for cctx.Err() == nil {
			cl.PollFetches(cctx).EachRecord(func(r *kgo.Record) { seen <- string(r.Key) })
		}
	}()

	const n = 200
	lat := make([]time.Duration, 0, n)
	for i := range n {
		id := fmt.Sprintf("lat-%d", i)
		if err := outbox.AppendPool(ctx, e.db.Pool, event(id, 1)); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		select {
		case got := <-seen:
			if got != id {
				t.Fatalf("consumed %s, want %s", got, id)
			}
			lat = append(lat, time.Since(committed))
		case <-time.After(2 * time.Second):
			t.Fatalf("event %d not published within 2s of its commit (PollInterval 5s): LISTEN/NOTIFY did not wake the relay", i)
		}
	}
	slices.Sort(lat)
	t.Logf("commit → consumed latency over %d events: p50 %v, p90 %v, p99 %v, max %v", n, lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])
}

func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// TestBrokerUnavailable: the broker refuses every produce for ten seconds
// (NOT_LEADER_FOR_PARTITION, then REQUEST_TIMED_OUT, which kfake answers
// after appending: the producer's idempotent retry must not duplicate).
// Rows wait, a row is marked published only once its record is in Kafka,
// and everything is published after the broker heals.
func TestBrokerUnavailable(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	// The producer retries quickly (franz-go waits up to 5s for fresh
	// metadata by default), so both kinds of refusal are exercised.
	cl := e.client(t, kgo.MetadataMinAge(100*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
	_, reg, _ := e.relay(t, outbox.Config{PollInterval: 100 * time.Millisecond, BatchSize: 50, Client: cl})

	appendAll := func(from, to int) {
		for i := from; i < to; i++ {
			var evs []outbox.Event
			for a := range 20 {
				evs = append(evs, event(fmt.Sprintf("acc-%02d", a), int64(i)))
			}
			if err := outbox.AppendPool(ctx, e.db.Pool, evs...); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendAll(1, 6)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("first events published", func() bool { return count(t, e, "published_at IS NULL") == 0 }))

	heal := time.Now().Add(10 * time.Second)
	notLeader := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotLeaderForPartition, Count: -1,
		When: func(kmsg.Request) bool { return time.Now().Before(heal.Add(-4 * time.Second)) }})
	defer notLeader.Remove()
	timedOut := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: -1,
		When: func(kmsg.Request) bool { return time.Now().Before(heal) }})
	defer timedOut.Remove()
	appendAll(6, 21) // while the broker is down
	testenv.WaitFor(t, 10*time.Second, func() error {
		if notLeader.Hits() == 0 {
			return errors.New("no produce request refused yet")
		}
		return nil
	})
	// Until the broker heals, sampled every half second: nothing more is
	// marked published and every new row stays pending.
	published, samples, next := count(t, e, "published_at IS NOT NULL"), 0, time.Now()
	testenv.WaitFor(t, 30*time.Second, func() error {
		if time.Now().Before(next) {
			return fmt.Errorf("the broker refuses produce requests for another %v", time.Until(heal))
		}
		next = time.Now().Add(500 * time.Millisecond)
		checkMarkedSubsetOfKafka(t, e)
		n, pending := count(t, e, "published_at IS NOT NULL"), count(t, e, "published_at IS NULL")
		if time.Now().After(heal) {
			return nil // this sample may have seen the broker healed
		}
		samples++
		if n != published {
			t.Fatalf("%d rows marked published while every produce fails (%d when the first was refused)", n, published)
		}
		if pending != 15*20 {
			t.Fatalf("%d rows pending during the outage, want %d", pending, 15*20)
		}
		return fmt.Errorf("the broker refuses produce requests for another %v", time.Until(heal))
	})
	if samples < 5 {
		t.Errorf("only %d samples during the outage", samples)
	}
	notLeader.Remove()
	timedOut.Remove()
	if notLeader.Hits() == 0 || timedOut.Hits() == 0 {
		t.Fatalf("produce requests faulted: %d NOT_LEADER_FOR_PARTITION, %d REQUEST_TIMED_OUT; want both", notLeader.Hits(), timedOut.Hits())
	}
	testenv.WaitFor(t, 60*time.Second, testenv.Holds("everything published after healing", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	checkMarkedSubsetOfKafka(t, e)
	recs := e.readAll(t)
	checkOrder(t, recs, 20*20)
	t.Logf("produce requests faulted: %d NOT_LEADER_FOR_PARTITION, %d REQUEST_TIMED_OUT (appended, then refused); %d records for %d events",
		notLeader.Hits(), timedOut.Hits(), len(recs), 20*20)
	if v := gauge(t, reg, "projector_outbox_published_total"); v < 400 {
		t.Errorf("projector_outbox_published_total %v, want at least 400", v)
	}
	if v := gauge(t, reg, "projector_outbox_publish_duration_seconds"); v < 400 {
		t.Errorf("projector_outbox_publish_duration_seconds has %v samples, want at least 400", v)
	}
}

// checkMarkedSubsetOfKafka: every row marked published has its record in
// Kafka (marks are read first: a row marked before is acknowledged before).
func checkMarkedSubsetOfKafka(t *testing.T, e *env) {
	t.Helper()
	rows, err := e.db.Pool.Query(t.Context(), `SELECT id FROM projector_outbox WHERE published_at IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	marked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	inKafka := map[string]bool{}
	for _, r := range e.readAll(t) {
		id, _ := header(r, outbox.HeaderCEID)
		inKafka[id] = true
	}
	for _, id := range marked {
		if !inKafka[id] {
			t.Fatalf("event %s is marked published but is not in Kafka", id)
		}
	}
}

// checkOrder: every aggregate's versions first appear in order 1, 2, 3 …
// (a repeated version is a duplicate, allowed) and want events in total
// reached Kafka.
func checkOrder(t *testing.T, recs []*kgo.Record, want int) {
	t.Helper()
	seen := map[string]map[int64]bool{}
	last := map[string]int64{}
	distinct := 0
	for _, r := range recs {
		v := recordVersion(t, r)
		k := string(r.Key)
		if seen[k] == nil {
			seen[k] = map[int64]bool{}
		}
		if seen[k][v] {
			continue
		}
		if v != last[k]+1 {
			t.Fatalf("aggregate %s: version %d first published after %d", k, v, last[k])
		}
		seen[k][v], last[k] = true, v
		distinct++
	}
	if distinct != want {
		t.Errorf("%d distinct events in Kafka, want %d", distinct, want)
	}
}

// recordVersion reads the version of a demo event record.
func recordVersion(t *testing.T, r *kgo.Record) int64 {
	t.Helper()
	v, err := decodeVersion(r.Value)
	if err != nil {
		t.Fatalf("record %s: %v", r.Key, err)
	}
	return v
}

// decodeVersion reads the demo schema's version: account_id (string) then
// version (long), zig-zag varints after the 5-byte wire header.
func decodeVersion(value []byte) (int64, error) {
	if len(value) < 6 || value[0] != 0 {
		return 0, errors.New("not wire format")
	}
	b := value[5:]
	n, k := varint(b)
	if k == 0 || int(n) < 0 || k+int(n) > len(b) {
		return 0, errors.New("bad account_id")
	}
	b = b[k+int(n):]
	v, k := varint(b)
	if k == 0 {
		return 0, errors.New("bad version")
	}
	return v, nil
}

func varint(b []byte) (int64, int) {
	var u uint64
	for i := 0; i < len(b) && i < 10; i++ {
		u |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return int64(u>>1) ^ -int64(u&1), i + 1
		}
	}
	return 0, 0
}

// TestBlockedValue: a value that does not fit the topic's schema blocks its
// aggregate's later events, not other aggregates; once the row is fixed
// and retried, the aggregate continues in order.
func TestBlockedValue(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	_, reg, _ := e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond, CleanupInterval: 200 * time.Millisecond})
	bad := event("acc-bad", 2)
	bad.Value.(map[string]any)["version"] = "two"
	if err := outbox.AppendPool(ctx, e.db.Pool, event("acc-bad", 1), bad, event("acc-bad", 3), event("acc-good", 1)); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AppendPool(ctx, e.db.Pool, event("acc-good", 2)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the good aggregate and acc-bad v1 published", func() bool {
		return count(t, e, "published_at IS NOT NULL") == 3 && count(t, e, "error IS NOT NULL") == 1
	}))
	var errText string
	if err := e.db.Pool.QueryRow(ctx, `SELECT error FROM projector_outbox WHERE error IS NOT NULL`).Scan(&errText); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errText, "version") {
		t.Errorf("blocked row's error %q does not name the field", errText)
	}
	testenv.WaitFor(t, 5*time.Second, testenv.Holds("projector_outbox_blocked 1", func() bool { return gauge(t, reg, "projector_outbox_blocked") == 1 }))
	if count(t, e, "aggregate_id = 'acc-bad' AND version = 3 AND published_at IS NULL") != 1 {
		t.Fatal("acc-bad v3 was published past the blocked v2")
	}
	// Fix the value; the periodic retry unblocks it.
	if _, err := e.db.Pool.Exec(ctx, `UPDATE projector_outbox SET value = jsonb_set(value, '{version}', '2') WHERE error IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("acc-bad published after the fix", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	checkOrder(t, e.readAll(t), 5)
}

// TestRetention: published rows are deleted after Retention, unpublished
// ones never.
func TestRetention(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	const retention = 2 * time.Second
	e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond, Retention: retention, CleanupInterval: 100 * time.Millisecond})
	if err := outbox.AppendPool(ctx, e.db.Pool, event("acc-r", 1), event("acc-r", 2)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("published", func() bool { return count(t, e, "published_at IS NOT NULL") == 2 }))
	// An unpublished row (a topic the broker does not know keeps it
	// pending), written while the published ones wait out their
	// retention, outlives the cleanup that deletes them.
	ev := event("acc-r", 3)
	ev.Topic, ev.Value, ev.Payload = "no.such.topic", nil, []byte{0, 0, 0, 0, 1}
	if err := outbox.AppendPool(ctx, e.db.Pool, ev); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e, "published_at IS NOT NULL"); n != 2 {
		t.Fatalf("%d published rows left within %v of publishing, want 2", n, retention)
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("published rows deleted after retention", func() bool {
		return count(t, e, "published_at IS NOT NULL") == 0
	}))
	if n := count(t, e, "published_at IS NULL"); n != 1 {
		t.Errorf("%d unpublished rows, want the one for the missing topic", n)
	}
}

// TestReplicasShareShards: two relays split the shards; when one stops,
// the other takes them all; events are published in order throughout.
func TestReplicasShareShards(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	cfg := outbox.Config{PollInterval: 50 * time.Millisecond, BatchSize: 20}
	_, _, stopA := e.relay(t, cfg)
	_, regB, _ := e.relay(t, cfg)

	var writer sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const aggs = 40
	writer.Go(func() {
		for v := int64(1); wctx.Err() == nil; v++ {
			var evs []outbox.Event
			for a := range aggs {
				evs = append(evs, event(fmt.Sprintf("acc-%02d", a), v))
			}
			if err := outbox.AppendPool(ctx, e.db.Pool, evs...); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	owners := func() map[int32]int {
		m, err := outbox.ShardOwners(ctx, e.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		per := map[int32]int{}
		for _, pid := range m {
			per[pid]++
		}
		return per
	}
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("two relays with 8 shards each", func() bool {
		per := owners()
		return len(per) == 2 && slices.Equal(sortedValues(per), []int{8, 8})
	}))
	stopA()
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the remaining relay owns all 16 shards", func() bool {
		return gauge(t, regB, "projector_outbox_shards_owned") == 16 && len(owners()) == 1
	}))
	// The writer goes on until the remaining relay has published some of
	// what was written after the handover.
	handover := gauge(t, regB, "projector_outbox_published_total")
	testenv.WaitFor(t, 20*time.Second, func() error {
		if n := gauge(t, regB, "projector_outbox_published_total"); n < handover+4*aggs {
			return fmt.Errorf("relay B published %v events since it owns every shard, want %d", n-handover, 4*aggs)
		}
		return nil
	})
	cancel()
	writer.Wait()
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("all published", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	checkOrder(t, e.readAll(t), count(t, e, "true"))
}

func sortedValues(m map[int32]int) []int {
	var out []int
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// TestShardCountMismatch: a relay started with another shard count than
// the running one refuses to own shards, and once it is gone the running
// one publishes everything in order.
func TestShardCountMismatch(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	_, regA, _ := e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond})
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("relay A owning all shards", func() bool { return gauge(t, regA, "projector_outbox_shards_owned") == 16 }))
	var logsB syncBuffer
	_, regB, stopB := e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond, Shards: 8, Logger: slog.New(slog.NewTextHandler(&logsB, nil))})
	for v := int64(1); v <= 10; v++ {
		if err := outbox.AppendPool(ctx, e.db.Pool, event("acc-m", v)); err != nil {
			t.Fatal(err)
		}
	}
	// Relay B sees relay A and refuses, without ever owning a shard.
	testenv.WaitFor(t, 20*time.Second, func() error {
		if got := gauge(t, regB, "projector_outbox_shards_owned"); got != 0 {
			t.Fatalf("relay B (8 shards) owns %v shards beside relay A (16 shards)", got)
		}
		if !strings.Contains(logsB.String(), "relays with another shard count run on this outbox") {
			return errors.New("relay B has not yet noticed relay A's shard count")
		}
		return nil
	})
	if got := gauge(t, regB, "projector_outbox_shards_owned"); got != 0 {
		t.Fatalf("relay B (8 shards) owns %v shards beside relay A (16 shards)", got)
	}
	stopB()
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("all published by relay A", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	checkOrder(t, e.readAll(t), 10)
}

// TestPostgresRestart restarts a private Postgres twice (fast shutdown:
// every session cut, the relay's shard locks with it) while a writer
// appends: the relay reconnects, takes its shards again, and every event
// is published in order.
func TestPostgresRestart(t *testing.T) {
	ctx := t.Context()
	srv := testenv.StartPostgres(t)
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	e := setup(t)
	e.db = &testenv.DB{Pool: pool, URL: srv.URL}
	_, reg, _ := e.relay(t, outbox.Config{PollInterval: 100 * time.Millisecond, BatchSize: 20})

	const aggs = 20
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg      sync.WaitGroup
		written int
	)
	wg.Go(func() {
		for v := int64(1); wctx.Err() == nil; v++ {
			var evs []outbox.Event
			for a := range aggs {
				ev := event(fmt.Sprintf("acc-%02d", a), v)
				ev.ID = fmt.Sprintf("%d-%d", a, v)
				evs = append(evs, ev)
			}
			// Retry through the restarts; a commit whose answer was lost
			// may be written twice (same ids), which is a duplicate.
			for wctx.Err() == nil {
				if err := outbox.AppendPool(ctx, pool, evs...); err == nil {
					written += aggs
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	published := func() float64 { return gauge(t, reg, "projector_outbox_published_total") }
	for i, at := range []float64{500, 1500} {
		testenv.WaitFor(t, time.Minute, testenv.Holds(fmt.Sprintf("%v events published", at), func() bool { return published() >= at }))
		srv.Restart(t)
		t.Logf("restart %d after %v events published", i+1, published())
	}
	testenv.WaitFor(t, time.Minute, testenv.Holds("publishing after the restarts", func() bool { return published() >= 2500 }))
	stop()
	wg.Wait()
	testenv.WaitFor(t, time.Minute, testenv.Holds("all published", func() bool {
		var pending int
		return pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox WHERE published_at IS NULL`).Scan(&pending) == nil && pending == 0
	}))
	checkOrder(t, e.readAll(t), written)
}

// TestMigrateConcurrently: replicas starting together may all migrate.
func TestMigrateConcurrently(t *testing.T) {
	db := testenv.NewDB(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := outbox.Migrate(t.Context(), db.Pool); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := outbox.AppendPool(t.Context(), db.Pool, event("acc-1", 1)); err != nil {
		t.Fatal(err)
	}
}

// TestAppendValidation: an event missing what the record needs is refused
// and nothing of the call is written.
func TestAppendValidation(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	good := event("acc-v", 1)
	for _, tc := range []struct {
		mod  func(*outbox.Event)
		want string
	}{
		{func(e *outbox.Event) { e.AggregateID = "" }, "AggregateID"},
		{func(e *outbox.Event) { e.AggregateType = "" }, "AggregateType"},
		{func(e *outbox.Event) { e.Version = 0 }, "Version"},
		{func(e *outbox.Event) { e.Type = "" }, "Type"},
		{func(e *outbox.Event) { e.Topic = "" }, "Topic"},
		{func(e *outbox.Event) { e.Payload = []byte{0} }, "exactly one of Value and Payload"},
		{func(e *outbox.Event) { e.Value = nil }, "exactly one of Value and Payload"},
		{func(e *outbox.Event) { e.Source = "://bad" }, "URI-reference"},
		{func(e *outbox.Event) { e.Value = map[string]any{"f": func() {}} }, "Value"},
	} {
		bad := good
		tc.mod(&bad)
		err := outbox.AppendPool(ctx, e.db.Pool, good, bad)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error naming %q", err, tc.want)
		}
	}
	if n := count(t, e, "true"); n != 0 {
		t.Errorf("%d rows written by refused calls", n)
	}
	if _, err := outbox.New(e.db.Pool, outbox.Config{Client: e.client(t, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())}); err == nil {
		t.Error("New accepted a non-idempotent client")
	}
	if _, err := outbox.New(e.db.Pool, outbox.Config{Client: e.client(t), Shards: -1}); err == nil {
		t.Error("New accepted Shards -1")
	}
}

// BenchmarkRelay measures the relay's throughput: b.N events (of 1,000
// aggregates, half with a Value to encode, half with a Payload) are
// appended first, then one relay publishes them all. Run with
// -benchtime=100000x for a stable figure.
func BenchmarkRelay(b *testing.B) {
	ctx := b.Context()
	db := testenv.NewDB(b)
	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}
	_, reg := testenv.Registry(b)
	enc, err := demo.RegisterSchemas(ctx, reg)
	if err != nil {
		b.Fatal(err)
	}
	kafka := testenv.Kafka(b, topic, 6)
	versions := map[string]int64{}
	for start := 0; start < b.N; start += 1000 {
		var evs []outbox.Event
		for i := start; i < min(b.N, start+1000); i++ {
			key := fmt.Sprintf("acc-%04d", i%1000)
			versions[key]++
			ev := event(key, versions[key])
			if i%2 == 0 {
				ev.Payload, err = enc.Encode(demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: versions[key], Type: "Deposited", Amount: 1, OccurredAt: time.Now()}})
				if err != nil {
					b.Fatal(err)
				}
				ev.Value = nil
			}
			evs = append(evs, ev)
		}
		if err := outbox.AppendPool(ctx, db.Pool, evs...); err != nil {
			b.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	metrics := prometheus.NewRegistry()
	r, err := outbox.New(db.Pool, outbox.Config{Client: cl, Registry: reg, Logger: slog.New(slog.DiscardHandler), Registerer: metrics})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	// Watch the relay's counter, not the table: counting pending rows
	// over and over would compete with the relay for Postgres.
	for {
		mfs, err := metrics.Gather()
		if err != nil {
			b.Fatal(err)
		}
		var n float64
		for _, mf := range mfs {
			if mf.GetName() == "projector_outbox_published_total" {
				for _, m := range mf.GetMetric() {
					n += m.GetCounter().GetValue()
				}
			}
		}
		if n >= float64(b.N) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
}

// syncBuffer is a log sink a running relay writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestRetryConfig: a backoff that cannot work is refused with the field
// named; zero values take the defaults.
func TestRetryConfig(t *testing.T) {
	e := setup(t)
	for _, tc := range []struct {
		cfg  outbox.Config
		want string // "" accepts the config
	}{
		{outbox.Config{}, ""},
		{outbox.Config{RetryBase: time.Second, RetryCap: time.Minute}, ""},
		{outbox.Config{RetryBase: -time.Second}, "Config.RetryBase"},
		{outbox.Config{RetryCap: -time.Second}, "Config.RetryCap"},
		{outbox.Config{RetryBase: time.Minute, RetryCap: time.Second}, "Config.RetryCap"},
	} {
		tc.cfg.Client = e.client(t)
		_, err := outbox.New(e.db.Pool, tc.cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("RetryBase %v, RetryCap %v: %v, want it accepted", tc.cfg.RetryBase, tc.cfg.RetryCap, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("RetryBase %v, RetryCap %v: %v, want an error naming %s", tc.cfg.RetryBase, tc.cfg.RetryCap, err, tc.want)
		}
	}
}
