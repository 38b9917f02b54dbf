package outbox_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
)

// relayPool is a pool of its own for a relay, its sessions named app in
// pg_stat_activity so that a test can terminate them and only them. While
// refuse is set, it opens no connection.
func relayPool(t *testing.T, e *env, app string, refuse *atomic.Bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if refuse != nil && refuse.Load() {
			return errors.New("connections refused by the test")
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// terminate ends every session named app and returns how many it ended.
func terminate(t *testing.T, e *env, app string) int {
	t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startRelay runs a relay on pool until the test ends.
func startRelay(t *testing.T, pool *pgxpool.Pool, cfg outbox.Config) *outbox.Relay {
	t.Helper()
	r, err := outbox.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})
	return r
}

func appendVersions(t *testing.T, e *env, aggs int, from, to int64) {
	t.Helper()
	for v := from; v <= to; v++ {
		var evs []outbox.Event
		for a := range aggs {
			evs = append(evs, event(fmt.Sprintf("acc-%02d", a), v))
		}
		if err := outbox.AppendPool(t.Context(), e.db.Pool, evs...); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBrokerStallHeard: while the broker refuses every produce request,
// the relay says so within UnreadyAfter, once (a warning, the
// projector_outbox_produce_stalled gauge, a failing "kafka" readiness
// check), and all of it clears when the broker acknowledges again.
func TestBrokerStallHeard(t *testing.T) {
	ctx := t.Context()
	e := setup(t)
	var logs syncBuffer
	cl := e.client(t, kgo.MetadataMinAge(50*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }))
	r, reg, _ := e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond, Client: cl, UnreadyAfter: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	appendVersions(t, e, 5, 1, 1)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("first events published", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	if err := r.Ready(ctx)["kafka"]; err != nil {
		t.Fatalf("kafka readiness %v before any fault", err)
	}

	down := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotLeaderForPartition, Count: -1})
	defer down.Remove()
	appendVersions(t, e, 5, 2, 3)
	const warning = "records wait for the broker's acknowledgement"
	testenv.WaitFor(t, 10*time.Second, func() error {
		switch {
		case !strings.Contains(logs.String(), warning):
			return errors.New("no warning logged yet")
		case gauge(t, reg, "projector_outbox_produce_stalled") != 1:
			return errors.New("projector_outbox_produce_stalled is not 1")
		case r.Ready(ctx)["kafka"] == nil:
			return errors.New("the kafka readiness check still passes")
		}
		return nil
	})
	// The warning is not repeated while the outage lasts (well under a
	// minute here), though the relay checks many times a second.
	stalledAt := down.Hits()
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("more produce requests refused", func() bool { return down.Hits() >= stalledAt+10 }))
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Errorf("the stall was logged %d times, want once:\n%s", n, logs.String())
	}
	if n := count(t, e, "published_at IS NULL"); n != 10 {
		t.Errorf("%d rows pending during the outage, want 10", n)
	}

	down.Remove()
	testenv.WaitFor(t, 20*time.Second, func() error {
		switch {
		case count(t, e, "published_at IS NULL") != 0:
			return errors.New("rows still pending after the broker healed")
		case gauge(t, reg, "projector_outbox_produce_stalled") != 0:
			return errors.New("projector_outbox_produce_stalled is not back to 0")
		case r.Ready(ctx)["kafka"] != nil:
			return fmt.Errorf("kafka readiness still failing: %v", r.Ready(ctx)["kafka"])
		}
		return nil
	})
	if !strings.Contains(logs.String(), "the broker acknowledges records again") {
		t.Errorf("the recovery was not logged:\n%s", logs.String())
	}
	checkOrder(t, e.readAll(t), 15)
}

// TestSessionTerminatedRecovers: every session of the relay is terminated
// ten times (its shard locks' session and its pooled connections, as an
// administrator or a failover would); each time it publishes again within
// a few seconds, since a session that did its work restarts without the
// backoff of earlier failures and a dead pooled connection is not used
// again. Its log blames the lost connection, never a missing migration,
// and each restart is counted.
func TestSessionTerminatedRecovers(t *testing.T) {
	e := setup(t)
	var logs syncBuffer
	const app = "relay-terminated"
	reg := prometheus.NewRegistry()
	startRelay(t, relayPool(t, e, app, nil), outbox.Config{
		Client: e.client(t), Registry: e.reg, Registerer: reg,
		PollInterval: time.Second, RetryBase: 100 * time.Millisecond, RetryCap: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	appendVersions(t, e, 5, 1, 1)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("first events published", func() bool { return count(t, e, "published_at IS NULL") == 0 }))

	const terminations, bound = 10, 5 * time.Second
	for i := range terminations {
		if n := terminate(t, e, app); n == 0 {
			t.Fatalf("termination %d: no session of the relay found", i+1)
		}
		start := time.Now()
		v := int64(i + 2)
		appendVersions(t, e, 5, v, v)
		testenv.WaitFor(t, 60*time.Second, testenv.Holds(fmt.Sprintf("v%d published after termination %d", v, i+1), func() bool {
			return count(t, e, "published_at IS NULL") == 0
		}))
		if took := time.Since(start); took > bound {
			t.Errorf("termination %d: published again after %v, want within %v\n%s", i+1, took.Round(time.Millisecond), bound, logs.String())
		}
	}
	if strings.Contains(logs.String(), "Migrate") {
		t.Errorf("the log blames a missing migration for a lost connection:\n%s", logs.String())
	}
	if got := counterWith(t, reg, "projector_outbox_session_restarts_total", "reason", "connection_lost"); got < terminations {
		t.Errorf("projector_outbox_session_restarts_total{reason=\"connection_lost\"} %v, want at least %d", got, terminations)
	}
	checkOrder(t, e.readAll(t), 5*(terminations+1))
}

// counterWith is the value of the series of name whose label has value.
func counterWith(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// producerOf returns the producer id of the first record batch of a
// produce request's partition (the record batch header holds it at byte
// 43), so that a fault can refuse one relay's requests only.
func producerOf(records []byte) (int64, bool) {
	if len(records) < 51 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(records[43:51])), true
}

// TestSessionLossStopsProducing: relay A's records are stuck (the broker
// refuses its producer's requests) when its database session is
// terminated, and it cannot connect again; relay B takes the shards over
// and publishes the rows. When the broker takes A's requests again, A must
// have withdrawn its records: no record of A may follow B's for an
// aggregate, or two relays would have published one aggregate's events at
// once.
func TestSessionLossStopsProducing(t *testing.T) {
	e := setup(t)
	const (
		app  = "relay-a"
		aggs = 10
	)
	var refuse, faultA atomic.Bool
	clA := e.client(t, kgo.MetadataMinAge(50*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }))
	regA := prometheus.NewRegistry()
	startRelay(t, relayPool(t, e, app, &refuse), outbox.Config{
		Client: clA, Registry: e.reg, Registerer: regA, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	appendVersions(t, e, aggs, 1, 1)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("v1 published by relay A", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	recs := e.readAll(t)
	pidA := recs[0].ProducerID

	stuck := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotLeaderForPartition, Count: -1,
		When: func(req kmsg.Request) bool {
			if !faultA.Load() {
				return false
			}
			for _, tp := range req.(*kmsg.ProduceRequest).Topics {
				for _, p := range tp.Partitions {
					if pid, ok := producerOf(p.Records); ok && pid == pidA {
						return true
					}
				}
			}
			return false
		}})
	defer stuck.Remove()
	faultA.Store(true)
	appendVersions(t, e, aggs, 2, 4)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("relay A's produce requests refused", func() bool { return stuck.Hits() >= 3 }))

	refuse.Store(true)
	if n := terminate(t, e, app); n == 0 {
		t.Fatal("no session of relay A found")
	}
	_, _, _ = e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond})
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("every row published by relay B", func() bool { return count(t, e, "published_at IS NULL") == 0 }))

	// The broker takes A's requests again: whatever A still holds would go
	// out now.
	faultA.Store(false)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("relay A's client holding no records", func() bool { return clA.BufferedProduceRecords() == 0 }))

	recs = e.readAll(t)
	firstOfB := map[string]int64{} // aggregate → offset of relay B's first record
	for _, r := range recs {
		k := string(r.Key)
		if r.ProducerID == pidA {
			if at, ok := firstOfB[k]; ok {
				t.Errorf("aggregate %s: relay A published v%d at offset %d after relay B took over at offset %d", k, recordVersion(t, r), r.Offset, at)
			}
			continue
		}
		if _, ok := firstOfB[k]; !ok {
			firstOfB[k] = r.Offset
		}
	}
	if len(firstOfB) != aggs {
		t.Errorf("relay B published %d aggregates, want %d", len(firstOfB), aggs)
	}
	checkOrder(t, recs, 4*aggs)
}

// TestMissingTableNamed: a relay on a database without the outbox table
// says to migrate, and counts its restarts as no_table.
func TestMissingTableNamed(t *testing.T) {
	db := testenv.NewDB(t)
	kafka := testenv.Kafka(t, topic, 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	r := startRelay(t, db.Pool, outbox.Config{Client: cl, Registerer: reg, PollInterval: 50 * time.Millisecond, RetryCap: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("a no_table restart counted", func() bool {
		return counterWith(t, reg, "projector_outbox_session_restarts_total", "reason", "no_table") >= 1
	}))
	if !strings.Contains(logs.String(), "run outbox.Migrate") {
		t.Errorf("the log does not say to migrate:\n%s", logs.String())
	}
	if err := r.Ready(t.Context())["outbox session"]; err == nil || !strings.Contains(err.Error(), "projector_outbox") {
		t.Errorf("readiness %v, want it to name the missing table", err)
	}
}

// TestProduceFailuresCounted: records the Kafka client gives up on count
// in projector_outbox_produce_failures_total, and their rows are published
// once the broker takes them.
func TestProduceFailuresCounted(t *testing.T) {
	e := setup(t)
	cl := e.client(t, kgo.RecordRetries(1), kgo.MetadataMinAge(50*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
	_, reg, _ := e.relay(t, outbox.Config{PollInterval: 50 * time.Millisecond, Client: cl, RetryCap: 200 * time.Millisecond})
	down := e.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotLeaderForPartition, Count: -1})
	defer down.Remove()
	appendVersions(t, e, 3, 1, 2)
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("produce failures counted", func() bool {
		return gauge(t, reg, "projector_outbox_produce_failures_total") >= 1
	}))
	down.Remove()
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("all published", func() bool { return count(t, e, "published_at IS NULL") == 0 }))
	checkOrder(t, e.readAll(t), 6)
}
