package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
)

// TestDeadLetterLifecycle dead-letters a record whose schema id is not
// registered (after the attempt limit) and a garbage record, publishes
// both to the dead-letter topic with Kafka Connect's error headers, then
// replays them: once the schema exists the first applies and its entry
// is resolved; replaying it again changes nothing; the garbage record
// fails again and reopens its own entry instead of adding one.
func TestDeadLetterLifecycle(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 1)
	cl := f.kafkaClient(t)
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "accounts.dlq"); err != nil {
		t.Fatal(err)
	}
	ids, err := f.reg.SchemaByVersion(ctx, f.kafka.Topic+"-value", 1)
	if err != nil {
		t.Fatal(err)
	}
	const unknownID = 901
	value, err := schemas.AppendWire(nil, unknownID, f.enc.ReaderSchema(), map[string]any{
		"account_id": "late-2", "version": int64(1), "type": "AccountOpened", "owner": "o", "amount": int64(0),
		"occurred_at": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: f.kafka.Topic, Key: []byte("late-2"), Value: value, Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}},
		&kgo.Record{Topic: f.kafka.Topic, Key: []byte("junk-1"), Value: []byte("junk")},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cfg := fastRetry
	cfg.MaxAttempts = 2
	run(t, f.engine(t, "lifecycle", projector.Config{Partition: cfg, DLQTopic: "accounts.dlq"}))

	var dls []deadletters.Entry
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("two dead letters", func() bool {
		dls, err = deadletters.List(ctx, f.db.Pool, deadletters.Filter{Identity: "lifecycle"})
		return err == nil && len(dls) == 2
	}))
	byKey := map[string]deadletters.Entry{}
	for _, d := range dls {
		byKey[d.Key] = d
	}
	late, junk := byKey["late-2"], byKey["junk-1"]
	if late.ErrorClass != sinks.ClassDecode || late.Attempts != 2 || late.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		late.SchemaID == nil || *late.SchemaID != unknownID {
		t.Errorf("late-2 dead letter: class %q, attempts %d, trace %q, schema id %v; want decode, 2, the traceparent's trace id, %d",
			late.ErrorClass, late.Attempts, late.TraceID, late.SchemaID, unknownID)
	}

	// Both were published to the dead-letter topic, with error headers.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(f.kafka.Addrs()...), kgo.ConsumeTopics("accounts.dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	published := map[string]map[string]string{}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(published) < 2 && pctx.Err() == nil {
		consumer.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			published[string(r.Key)] = h
		})
	}
	for _, key := range []string{"late-2", "junk-1"} {
		h := published[key]
		if h["__connect.errors.topic"] != f.kafka.Topic || h["__connect.errors.exception.message"] == "" || h["projector-dlq-id"] == "" {
			t.Errorf("dead letter %s on the DLQ topic: headers %v, want __connect.errors.* and projector-dlq-id", key, h)
		}
	}

	// Register the schema, replay both.
	f.fake.SeedSchema(f.kafka.Topic+"-value", 98, unknownID, ids.Schema)
	if _, err := dlqpublish.Replay(ctx, f.db.Pool, cl, []deadletters.Entry{late, junk}, 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("the replayed late-2 to apply and junk-1 to fail again", func() bool {
		l, err1 := deadletters.Get(ctx, f.db.Pool, late.ID)
		j, err2 := deadletters.Get(ctx, f.db.Pool, junk.ID)
		return err1 == nil && err2 == nil && l.Status == deadletters.StatusResolved && j.Status == deadletters.StatusOpen && j.Attempts == 2
	}))
	// Replaying the applied one again changes nothing.
	late, _ = deadletters.Get(ctx, f.db.Pool, late.ID)
	if _, err := dlqpublish.Replay(ctx, f.db.Pool, cl, []deadletters.Entry{late}, 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("the second replay to be consumed", func() bool {
		l, err := deadletters.Get(ctx, f.db.Pool, late.ID)
		return err == nil && l.Status == deadletters.StatusResolved && l.Replays == 2
	}))
	var version int64
	var n int
	if err := f.db.Pool.QueryRow(ctx, `SELECT version FROM accounts WHERE account_id = 'late-2'`).Scan(&version); err != nil || version != 1 {
		t.Errorf("late-2: version %d (err %v), want 1", version, err)
	}
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_dead_letters`).Scan(&n); err != nil || n != 2 {
		t.Errorf("dead letters: %d (err %v), want still 2: a failed replay reopens its entry", n, err)
	}
}
