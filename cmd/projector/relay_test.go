package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/schemas"
)

// committedEvent is what the writer knows it committed.
type committedEvent struct {
	key     string
	version int64
}

// TestRelayCrashOrder runs two relay processes on one outbox while three
// writers append events for 600 aggregates, and kills a relay with SIGKILL
// eight times (alternating, each time after a further 1,500 events were
// marked published since the last kill) and restarts it. Afterwards every
// committed event must be in Kafka, no event of a rolled-back transaction
// may be, and every aggregate's versions must first appear in order
// 1, 2, 3 … (a repeated version, a crash's republished batch, is allowed).
func TestRelayCrashOrder(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.NewCluster(t, demo.Topic, 6)
	reg := testenv.NewRegistry(t)
	regClient := reg.Client
	enc, err := demo.RegisterSchemasFor(ctx, regClient, cluster.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	args := []string{"relay",
		"--brokers", cluster.Brokers(),
		"--registry-url", reg.URL,
		"--database-url", db.URL,
		"--http-addr", "",
		"--batch-size", "50",
		"--poll-interval", "200ms",
		"--log-level", "warn",
	}
	relays := []*child{startChild(t, args...), startChild(t, args...)}

	// Writers: each owns a third of the aggregates, so an aggregate's
	// versions are appended in order, each after the previous committed.
	// Every tenth transaction rolls back.
	const aggregates, writers = 600, 3
	var (
		mu         sync.Mutex
		committed  = map[string]committedEvent{} // by event id
		rolledBack = map[string]bool{}
	)
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			next := map[string]int64{}
			for n := 0; wctx.Err() == nil; n++ {
				var evs []outbox.Event
				for range 1 + rng.IntN(8) {
					key := fmt.Sprintf("acc-%04d", w+writers*rng.IntN(aggregates/writers))
					for range 1 + rng.IntN(3) {
						evs = append(evs, accountEvent(t, enc, key, next[key]+int64(countKey(evs, key))+1, rng.IntN(2) == 0))
					}
				}
				for i := range evs {
					evs[i].ID = fmt.Sprintf("w%d-%d-%d", w, n, i)
				}
				rollback := n%10 == 9
				// Not wctx: a transaction cancelled while committing may
				// have committed or not.
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if err := outbox.Append(ctx, tx, evs...); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				mu.Lock()
				switch {
				case err == errRollback:
					for _, e := range evs {
						rolledBack[e.ID] = true
					}
				case err != nil:
					mu.Unlock()
					t.Errorf("writer %d: %v", w, err)
					return
				default:
					for _, e := range evs {
						committed[e.ID] = committedEvent{e.AggregateID, e.Version}
						next[e.AggregateID] = e.Version
					}
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		})
	}

	published := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox WHERE published_at IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitUntil := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		testenv.WaitFor(t, timeout, func() error {
			if cond() {
				return nil
			}
			for i, c := range relays {
				select {
				case err := <-c.done:
					t.Fatalf("relay %d exited while waiting for %s: %v\n%s", i, what, err, c.stderr)
				default:
				}
			}
			return fmt.Errorf("%s; relay stderr:\n%s\n---\n%s", what, relays[0].stderr, relays[1].stderr)
		})
	}
	// Both processes share the shards before the first kill.
	waitUntil("both relays owning 8 shards each", 20*time.Second, func() bool {
		owners, err := outbox.ShardOwners(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		per := map[int32]int{}
		for _, pid := range owners {
			per[pid]++
		}
		return len(per) == 2 && len(owners) == 16 && per[owners[0]] == 8
	})

	const kills, step = 8, 1500
	last := published()
	for k := range kills {
		target := last + step
		waitUntil(fmt.Sprintf("%d events published", target), time.Minute, func() bool { return published() >= target })
		i := k % 2
		relays[i].kill(t)
		last = published()
		relays[i] = startChild(t, args...)
		t.Logf("kill %d: relay %d killed at %d events published", k+1, i, last)
	}
	// Let the restarted relays run beside the writers, then stop writing.
	waitUntil("more events published after the last restart", time.Minute, func() bool { return published() >= last+step })
	stopWriters()
	wg.Wait()
	waitUntil("every committed event published", 2*time.Minute, func() bool {
		var pending int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox WHERE published_at IS NULL`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	for i, c := range relays {
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-c.done; err != nil {
			t.Errorf("relay %d did not stop cleanly on SIGTERM: %v\n%s", i, err, c.stderr)
		}
		c.done <- nil
	}

	// Read the topic and check it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.Addrs()...), kgo.ConsumeTopics(cluster.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(rctx, cluster.Topic)
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	dec := schemas.NewDecoder(regClient, nil)
	var (
		inKafka  = map[string]int{}   // event id → copies
		lastSeen = map[string]int64{} // aggregate → highest version so far
		records  int
	)
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			t.Fatalf("reading the topic: %v", rctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := left[r.Partition]
			if !ok {
				return
			}
			if r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			records++
			var id string
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderCEID {
					id = string(h.Value)
				}
			}
			v, _, err := dec.Decode(rctx, r.Value)
			if err != nil {
				t.Fatalf("record %s at %d/%d: %v", r.Key, r.Partition, r.Offset, err)
			}
			version, key := v["version"].(int64), string(r.Key)
			if v["account_id"] != key {
				t.Fatalf("record key %s carries account %v", key, v["account_id"])
			}
			inKafka[id]++
			switch {
			case inKafka[id] > 1 && version <= lastSeen[key]:
				// A copy republished after a crash: allowed.
			case version == lastSeen[key]+1:
				lastSeen[key] = version
			default:
				t.Fatalf("aggregate %s: version %d (event %s) first published after version %d: order inverted", key, version, id, lastSeen[key])
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	for id, e := range committed {
		if inKafka[id] == 0 {
			t.Errorf("committed event %s (%s v%d) is not in Kafka", id, e.key, e.version)
		}
	}
	for id := range rolledBack {
		if inKafka[id] > 0 {
			t.Errorf("event %s of a rolled-back transaction is in Kafka", id)
		}
	}
	if len(inKafka) != len(committed) {
		t.Errorf("%d distinct events in Kafka, %d committed", len(inKafka), len(committed))
	}
	dups := records - len(inKafka)
	if dups > kills*50 {
		t.Errorf("%d duplicate records: more than one batch (50) per kill (%d)", dups, kills)
	}
	t.Logf("%d events committed (%d rolled back) over %d aggregates; %d records in Kafka, %d of them copies republished after a kill",
		len(committed), len(rolledBack), len(lastSeen), records, dups)
}

var errRollback = fmt.Errorf("roll back on purpose")

func countKey(evs []outbox.Event, key string) int {
	n := 0
	for _, e := range evs {
		if e.AggregateID == key {
			n++
		}
	}
	return n
}

// accountEvent is a demo account event, either as a Value the relay
// encodes or as a Payload encoded here.
func accountEvent(t *testing.T, enc *demo.Encoder, key string, version int64, payload bool) outbox.Event {
	ev := demo.Event{AccountID: key, Version: version, Type: "Deposited", Amount: version, OccurredAt: time.Now().UTC().Truncate(time.Millisecond)}
	if version == 1 {
		ev.Type, ev.Owner, ev.Amount = "AccountOpened", "owner "+key, 0
	}
	e := outbox.Event{AggregateType: "account", AggregateID: key, Version: version, Type: ev.Type, Topic: enc.Topic}
	if payload {
		b, err := enc.Encode(demo.Record{Key: key, Event: ev})
		if err != nil {
			t.Error(err)
		}
		e.Payload = b
		return e
	}
	v := map[string]any{"account_id": key, "version": version, "type": ev.Type, "amount": ev.Amount, "occurred_at": ev.OccurredAt, "owner": nil}
	if ev.Owner != "" {
		v["owner"] = ev.Owner
	}
	e.Value = v
	return e
}

// TestRelayFlags: bad relay flags stop the command with an error naming
// the flag.
func TestRelayFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay"}, "--brokers"},
		{[]string{"relay", "--brokers", "b", "--batch-size", "0"}, "--batch-size"},
		{[]string{"relay", "--brokers", "b", "--shards", "0"}, "--shards"},
		{[]string{"relay", "--brokers", "b", "--poll-interval", "0s"}, "--poll-interval"},
		{[]string{"relay", "--brokers", "b", "--retention", "0s"}, "--retention"},
		{[]string{"relay", "--brokers", "b", "--retry-base", "0s"}, "--retry-base"},
		{[]string{"relay", "--brokers", "b", "--retry-base", "1s", "--retry-cap", "100ms"}, "--retry-cap"},
		{[]string{"relay", "--brokers", "b", "--unready-after", "0s"}, "--unready-after"},
		{[]string{"relay", "--brokers", "b", "--startup-timeout", "0s"}, "--startup-timeout"},
		{[]string{"relay", "--brokers", "b", "--startup-timeout", "1s", "--http-addr", "", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, "cannot connect to PostgreSQL"},
	} {
		var out bytes.Buffer
		err := Main(t.Context(), tc.args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("projector %s: got error %v, want one naming %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// relayHTTP waits for the relay started as s to log its HTTP address and
// returns a GET of a path there (status and body).
func relayHTTP(t *testing.T, s *started) func(path string) (int, string) {
	t.Helper()
	addr := regexp.MustCompile(`"msg":"serving metrics and health","addr":"([^"]+)"`)
	var base string
	testenv.WaitFor(t, 30*time.Second, func() error {
		s.running(t)
		m := addr.FindStringSubmatch(s.out.String())
		if m == nil {
			return errors.New("no HTTP address logged yet")
		}
		base = "http://" + m[1]
		return nil
	})
	return func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
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
}

// TestRelayStartupWaitsForPostgres: the relay serves /readyz before it has
// PostgreSQL, saying that connecting is retried, and retries instead of
// exiting, as projector run does.
func TestRelayStartupWaitsForPostgres(t *testing.T) {
	cluster := testenv.Kafka(t, demo.Topic, 1)
	s := start(t, "relay", "--brokers", cluster.ListenAddrs()[0], "--http-addr", "127.0.0.1:0",
		"--database-url", "postgres://postgres@127.0.0.1:1/test?sslmode=disable", "--startup-timeout", "1m")
	get := relayHTTP(t, s)
	testenv.WaitFor(t, 30*time.Second, func() error {
		s.running(t)
		code, body := get("/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "startup") || !strings.Contains(body, "connect failed, retrying") {
			return fmt.Errorf("/readyz while starting: %d %q, want 503 saying that connecting is retried", code, body)
		}
		return nil
	})
	if _, body := get("/metrics"); !regexp.MustCompile(`projector_startup_retries_total\{step="connect"\} [1-9]`).MatchString(body) {
		t.Errorf("/metrics does not count the retries of connecting:\n%s", body)
	}
}

// TestRelayBrokerUnreachableHeard: with rows waiting and no broker to take
// them, the relay logs a warning within seconds (its own, and the Kafka
// client's), and /readyz fails naming Kafka.
func TestRelayBrokerUnreachableHeard(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AppendPool(ctx, db.Pool, outbox.Event{AggregateType: "account", AggregateID: "acc-1", Version: 1, Type: "Deposited",
		Topic: demo.Topic, Payload: []byte{0, 0, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := ln.Addr().String()
	ln.Close()
	s := start(t, "relay", "--brokers", nobody, "--http-addr", "127.0.0.1:0", "--database-url", db.URL,
		"--unready-after", "1s", "--log-level", "info")
	get := relayHTTP(t, s)
	testenv.WaitFor(t, 30*time.Second, func() error {
		s.running(t)
		out := s.out.String()
		code, body := get("/readyz")
		switch {
		case !strings.Contains(out, "records wait for the broker's acknowledgement"):
			return fmt.Errorf("no warning of the relay's yet:\n%s", out)
		case !strings.Contains(out, `"component":"kafka-client"`):
			return fmt.Errorf("no warning of the Kafka client's yet:\n%s", out)
		case code != http.StatusServiceUnavailable || !strings.Contains(body, "kafka"):
			return fmt.Errorf("/readyz %d %q, want 503 naming kafka", code, body)
		}
		return nil
	})
	if _, body := get("/metrics"); !strings.Contains(body, "projector_outbox_produce_stalled 1") {
		t.Errorf("/metrics does not show the stall:\n%s", body)
	}
}
