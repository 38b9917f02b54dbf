package dlqpublish_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

const (
	srcTopic = "accounts.events"
	dlqTopic = "accounts.events.dlq"
)

// dead is a dead letter as a test inserts it.
type dead struct {
	identity, projection string
	partition            int32
	offset               int64
	key, value           []byte
	headers              []sinks.Header
	err, class           string
	outbox               bool // also queue it for the dead-letter topic
}

func insert(t *testing.T, pool *pgxpool.Pool, d dead) int64 {
	t.Helper()
	if d.identity == "" {
		d.identity = "ident"
	}
	if d.projection == "" {
		d.projection = "accounts"
	}
	if d.class == "" {
		d.class = "decode"
	}
	hs := []byte("[]")
	if d.headers != nil {
		hs, _ = json.Marshal(d.headers)
	}
	var id int64
	err := pool.QueryRow(t.Context(), `INSERT INTO projector_dead_letters
		(identity, projection, topic, partition, "offset", record_key, value, headers, error, error_class)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10) RETURNING id`,
		d.identity, d.projection, srcTopic, d.partition, d.offset, d.key, d.value, string(hs), d.err, d.class).Scan(&id)
	if err != nil {
		t.Fatalf("insert dead letter: %v", err)
	}
	if d.outbox {
		if _, err := pool.Exec(t.Context(), `INSERT INTO projector_dlq_outbox (dead_letter_id, topic) VALUES ($1, $2)`, id, dlqTopic); err != nil {
			t.Fatalf("insert outbox row: %v", err)
		}
	}
	return id
}

func setup(t *testing.T, partitions int) (*testenv.DB, *kfake.Cluster) {
	t.Helper()
	db := testenv.NewDB(t)
	if err := postgres.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return db, testenv.Kafka(t, srcTopic, partitions, kfake.SeedTopics(2, dlqTopic))
}

func client(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// consume reads want records of topic from the start.
func consume(t *testing.T, c *kfake.Cluster, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := client(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d records of %s, want %d", len(out), topic, want)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch %s: %v", topic, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// endOffsets sums the log-end offsets of topic: how many records it holds.
func endOffsets(t *testing.T, c *kfake.Cluster, topic string) int64 {
	t.Helper()
	ends, err := kadm.NewClient(client(t, c)).ListEndOffsets(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

func header(r *kgo.Record, key string) (string, int) {
	var (
		v string
		n int
	)
	for _, h := range r.Headers {
		if h.Key == key {
			v, n = string(h.Value), n+1
		}
	}
	return v, n
}

func outboxCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_dlq_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPublishCopiesDeadLettersToTheTopic runs the publisher over more rows
// than one batch holds: every queued dead letter reaches the dead-letter
// topic once, byte for byte with Kafka Connect's error headers, and the
// outbox ends empty.
func TestPublishCopiesDeadLettersToTheTopic(t *testing.T) {
	db, c := setup(t, 3)
	ctx := t.Context()

	bin := []byte{0xff, 0x00, 0xfe}
	special := []dead{
		{partition: 2, offset: 41, key: []byte("acc-1"), value: []byte{0, 0, 0, 0, 9, 1, 2}, err: "schema id 9: unknown schema id", class: "decode",
			headers: []sinks.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}, {Key: "bin", Value: bin},
				{Key: sinks.ReplayHeader, Value: []byte("999")}, {Key: "empty", Value: []byte{}}},
			outbox: true},
		{partition: 0, offset: 7, key: nil, value: []byte("garbage"), err: "malformed", class: "invalid", identity: "other", outbox: true},
		{partition: 1, offset: 8, key: []byte("acc-2"), value: nil, err: "tombstone refused", class: "fold", outbox: true},
	}
	ids := make([]int64, len(special))
	for i, d := range special {
		ids[i] = insert(t, db.Pool, d)
	}
	notQueued := insert(t, db.Pool, dead{partition: 0, offset: 1, key: []byte("acc-3"), value: []byte("x"), err: "e"})
	const bulk = 2*dlqpublish.BatchSize + 100
	if _, err := db.Pool.Exec(ctx, `
		WITH d AS (
			INSERT INTO projector_dead_letters (identity, projection, topic, partition, "offset", record_key, value, error)
			SELECT 'ident', 'accounts', $1, 0, 1000 + g, convert_to('bulk-' || g, 'UTF8'), '\x00'::bytea, 'bulk'
			FROM generate_series(1, $2::int) g
			RETURNING id)
		INSERT INTO projector_dlq_outbox (dead_letter_id, topic) SELECT id, $3 FROM d`, srcTopic, bulk, dlqTopic); err != nil {
		t.Fatal(err)
	}

	pub := dlqpublish.New(db.Pool, client(t, c), nil, 20*time.Millisecond)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(rctx) }()
	testenv.WaitFor(t, 20*time.Second, func() error {
		if n := outboxCount(t, db.Pool); n > 0 {
			return fmt.Errorf("outbox still holds %d rows", n)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}

	total := len(special) + bulk
	if n := endOffsets(t, c, dlqTopic); n != int64(total) {
		t.Fatalf("dead-letter topic holds %d records, want %d (each queued dead letter once)", n, total)
	}
	recs := consume(t, c, dlqTopic, total)
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, n := header(r, sinks.ReplayHeader)
		if n != 1 {
			t.Fatalf("record has %d %s headers, want 1: %v", n, sinks.ReplayHeader, r.Headers)
		}
		byID[id] = r
	}
	if _, ok := byID[strconv.FormatInt(notQueued, 10)]; ok {
		t.Errorf("dead letter %d without an outbox row was published", notQueued)
	}
	for i, d := range special {
		r := byID[strconv.FormatInt(ids[i], 10)]
		if r == nil {
			t.Fatalf("dead letter %d not published", ids[i])
		}
		if !bytes.Equal(r.Key, d.key) || (r.Key == nil) != (d.key == nil) {
			t.Errorf("dead letter %d: key %q, want %q", ids[i], r.Key, d.key)
		}
		if !bytes.Equal(r.Value, d.value) || (r.Value == nil) != (d.value == nil) {
			t.Errorf("dead letter %d: value %x, want %x", ids[i], r.Value, d.value)
		}
		identity := d.identity
		if identity == "" {
			identity = "ident"
		}
		want := map[string]string{
			dlqpublish.HeaderTopic:          srcTopic,
			dlqpublish.HeaderPartition:      strconv.Itoa(int(d.partition)),
			dlqpublish.HeaderOffset:         strconv.FormatInt(d.offset, 10),
			dlqpublish.HeaderExceptionClass: d.class,
			dlqpublish.HeaderMessage:        d.err,
			dlqpublish.HeaderConnector:      identity,
			sinks.ReplayHeader:              strconv.FormatInt(ids[i], 10),
		}
		var orig []kgo.RecordHeader
		for _, h := range r.Headers {
			if w, ok := want[h.Key]; ok {
				if string(h.Value) != w {
					t.Errorf("dead letter %d: header %s = %q, want %q", ids[i], h.Key, h.Value, w)
				}
				delete(want, h.Key)
				continue
			}
			orig = append(orig, h)
		}
		if len(want) > 0 {
			t.Errorf("dead letter %d lacks headers %v", ids[i], want)
		}
		var wantOrig []sinks.Header
		for _, h := range d.headers {
			if h.Key != sinks.ReplayHeader {
				wantOrig = append(wantOrig, h)
			}
		}
		if len(orig) != len(wantOrig) {
			t.Fatalf("dead letter %d: original headers %v, want %v", ids[i], orig, wantOrig)
		}
		for j, h := range wantOrig {
			if orig[j].Key != h.Key || !bytes.Equal(orig[j].Value, h.Value) {
				t.Errorf("dead letter %d: header %d = %s:%x, want %s:%x", ids[i], j, orig[j].Key, orig[j].Value, h.Key, h.Value)
			}
		}
	}
	if n := outboxCount(t, db.Pool); n != 0 {
		t.Errorf("outbox holds %d rows after publishing", n)
	}
}

// TestPublishersTakeTurns runs two publishers on one schema at once: each
// dead letter is still published once.
func TestPublishersTakeTurns(t *testing.T) {
	db, c := setup(t, 1)
	const n = 3 * dlqpublish.BatchSize
	if _, err := db.Pool.Exec(t.Context(), `
		WITH d AS (
			INSERT INTO projector_dead_letters (identity, projection, topic, partition, "offset", record_key, value, error)
			SELECT 'ident', 'accounts', $1, 0, g, convert_to('k-' || g, 'UTF8'), '\x00'::bytea, 'e'
			FROM generate_series(1, $2::int) g
			RETURNING id)
		INSERT INTO projector_dlq_outbox (dead_letter_id, topic) SELECT id, $3 FROM d`, srcTopic, n, dlqTopic); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		pub := dlqpublish.New(db.Pool, client(t, c), nil, 10*time.Millisecond)
		wg.Go(func() {
			for {
				var left int
				if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_dlq_outbox`).Scan(&left); err != nil || left == 0 {
					errs <- err
					return
				}
				if _, err := pub.PublishBatch(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := endOffsets(t, c, dlqTopic); got != n {
		t.Fatalf("dead-letter topic holds %d records, want %d", got, n)
	}
}

func replayClient(t *testing.T, c *kfake.Cluster) *kgo.Client {
	return client(t, c, kgo.RecordPartitioner(kgo.ManualPartitioner()))
}

// TestReplayProducesTheOriginalRecord replays dead letters twice: each
// comes back on its topic and partition with its key, value and headers
// and exactly one sinks.ReplayHeader, and is counted and marked replayed.
func TestReplayProducesTheOriginalRecord(t *testing.T) {
	db, c := setup(t, 3)
	ctx := t.Context()
	ds := []dead{
		{partition: 2, offset: 5, key: []byte("acc-9"), value: []byte{0, 0, 0, 0, 1, 0x10, 0x20},
			headers: []sinks.Header{{Key: "a", Value: []byte("1")}, {Key: sinks.ReplayHeader, Value: []byte("12345")}, {Key: "bin", Value: []byte{0x80, 0x81}}},
			err:     "bad"},
		{partition: 1, offset: 6, key: nil, value: []byte("v"), err: "bad"},
	}
	for _, d := range ds {
		insert(t, db.Pool, d)
	}
	entries, err := deadletters.List(ctx, db.Pool, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	cl := replayClient(t, c)
	for round := 1; round <= 2; round++ {
		n, err := dlqpublish.Replay(ctx, db.Pool, cl, entries, 1000)
		if err != nil || n != len(entries) {
			t.Fatalf("round %d: Replay = %d, %v; want %d, nil", round, n, err, len(entries))
		}
		for _, e := range entries {
			got, err := deadletters.Get(ctx, db.Pool, e.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != deadletters.StatusReplayed || got.Replays != round || got.ReplayedAt == nil {
				t.Errorf("round %d: dead letter %d: status %s, replays %d, replayed_at %v", round, e.ID, got.Status, got.Replays, got.ReplayedAt)
			}
		}
	}
	recs := consume(t, c, srcTopic, 2*len(entries))
	if len(recs) != 2*len(entries) {
		t.Fatalf("%d records on %s, want %d", len(recs), srcTopic, 2*len(entries))
	}
	for _, r := range recs {
		idText, n := header(r, sinks.ReplayHeader)
		if n != 1 {
			t.Fatalf("replayed record has %d %s headers: %v", n, sinks.ReplayHeader, r.Headers)
		}
		var e *deadletters.Entry
		for i := range entries {
			if strconv.FormatInt(entries[i].ID, 10) == idText {
				e = &entries[i]
			}
		}
		if e == nil {
			t.Fatalf("replayed record names dead letter %q, not one of the entries", idText)
		}
		if r.Partition != e.Partition {
			t.Errorf("dead letter %d replayed to partition %d, want %d", e.ID, r.Partition, e.Partition)
		}
		if !bytes.Equal(r.Key, e.RecordKey()) || (r.Key == nil) != e.KeyNull || !bytes.Equal(r.Value, e.Value) {
			t.Errorf("dead letter %d: replayed key %q value %x, want %q %x", e.ID, r.Key, r.Value, e.RecordKey(), e.Value)
		}
		var want []sinks.Header
		for _, h := range e.Headers {
			if h.Key != sinks.ReplayHeader {
				want = append(want, h)
			}
		}
		want = append(want, sinks.Header{Key: sinks.ReplayHeader, Value: []byte(idText)})
		if len(r.Headers) != len(want) {
			t.Fatalf("dead letter %d: headers %v, want %v", e.ID, r.Headers, want)
		}
		for i, h := range want {
			if r.Headers[i].Key != h.Key || !bytes.Equal(r.Headers[i].Value, h.Value) {
				t.Errorf("dead letter %d: header %d = %s:%x, want %s:%x", e.ID, i, r.Headers[i].Key, r.Headers[i].Value, h.Key, h.Value)
			}
		}
	}
}

func TestReplayRefusesPurgedEntries(t *testing.T) {
	db, c := setup(t, 1)
	ctx := t.Context()
	insert(t, db.Pool, dead{offset: 1, key: []byte("a"), value: []byte("v"), err: "e"})
	insert(t, db.Pool, dead{offset: 2, key: []byte("b"), value: []byte("v"), err: "e"})
	if _, err := db.Pool.Exec(ctx, `UPDATE projector_dead_letters SET status = 'purged' WHERE "offset" = 2`); err != nil {
		t.Fatal(err)
	}
	entries, err := deadletters.List(ctx, db.Pool, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := dlqpublish.Replay(ctx, db.Pool, replayClient(t, c), entries, 0)
	if err == nil || n != 0 {
		t.Fatalf("Replay with a purged entry = %d, %v; want 0 and an error", n, err)
	}
	if got := endOffsets(t, c, srcTopic); got != 0 {
		t.Errorf("%d records produced, want none", got)
	}
}

// TestReplayIsRateLimited checks the limit by count: at 4 per second, a
// context of just over a second lets at most 5 of 10 through (the first
// at once, one more each 250ms), and exactly those are produced and
// marked.
func TestReplayIsRateLimited(t *testing.T) {
	db, c := setup(t, 1)
	for i := range 10 {
		insert(t, db.Pool, dead{offset: int64(i), key: []byte(fmt.Sprint("k", i)), value: []byte("v"), err: "e"})
	}
	entries, err := deadletters.List(t.Context(), db.Pool, deadletters.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 1100*time.Millisecond)
	defer cancel()
	n, err := dlqpublish.Replay(ctx, db.Pool, replayClient(t, c), entries, 4)
	if err == nil {
		t.Fatalf("Replay = %d, %v; want it stopped by the deadline", n, err)
	}
	if n < 1 || n > 5 {
		t.Fatalf("Replay produced %d records in ~1.1s at 4/s, want 1..5", n)
	}
	if got := endOffsets(t, c, srcTopic); got != int64(n) {
		t.Errorf("%d records on the topic, Replay reported %d", got, n)
	}
	replayed, err := deadletters.List(t.Context(), db.Pool, deadletters.Filter{Status: deadletters.StatusReplayed})
	if err != nil {
		t.Fatal(err)
	}
	if len(replayed) != n {
		t.Errorf("%d entries marked replayed, Replay reported %d", len(replayed), n)
	}
}
