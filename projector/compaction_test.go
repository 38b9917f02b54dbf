package projector_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestCompactedTopic reads a compacted topic of snapshots after the
// cleaner removed all but the last record of each key, some of them
// tombstones: the offsets have holes, each surviving snapshot is newer
// than the row (on_gap: apply), the stored offsets still reach the log
// end, and the table equals the reference fold of the produced stream.
func TestCompactedTopic(t *testing.T) {
	ctx := t.Context()
	c := testenv.NewCluster(t, "accounts.compacted", 3,
		testenv.TopicConfig("cleanup.policy", "compact"),
		// Roll segments quickly and clean as soon as anything is dirty, so
		// that the broker compacts within the test.
		testenv.TopicConfig("segment.ms", "100"),
		testenv.TopicConfig("min.cleanable.dirty.ratio", "0.001"),
		testenv.TopicConfig("min.compaction.lag.ms", "0"),
	)
	b := &bundle{db: testenv.NewDB(t), kafka: c}
	b.reg = testenv.NewRegistry(t).Client
	var err error
	if b.enc, err = demo.RegisterSchemasFor(ctx, b.reg, c.Topic); err != nil {
		t.Fatal(err)
	}
	file := bytes.Replace(demo.SnapshotProjections, []byte("mode: snapshot"), []byte("mode: snapshot\n    on_gap: apply"), 1)
	file = bytes.ReplaceAll(file, []byte("topic: "+demo.Topic), []byte("topic: "+c.Topic))
	if b.projs, err = projection.Parse(file, "."); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, b.db.Pool, b.projs...); err != nil {
		t.Fatal(err)
	}

	// Every account is opened and changed ten times; every seventh ends
	// in a tombstone.
	event := func(id string, v int64) demo.Record {
		ev := demo.Event{AccountID: id, Version: v, Type: "Deposited", Amount: v * 10, OccurredAt: time.Unix(v, 0).UTC()}
		if v == 1 {
			ev.Type, ev.Owner, ev.Amount = "AccountOpened", "owner "+id, 0
		}
		return demo.Record{Key: id, Event: ev}
	}
	for i := range 300 {
		id := fmt.Sprintf("acc-%03d", i)
		for v := int64(1); v <= 10; v++ {
			b.records = append(b.records, event(id, v))
		}
		if i%7 == 0 {
			b.records = append(b.records, demo.Record{Key: id, Tombstone: true})
		}
	}
	b.produce(t, b.records)
	produced := len(b.records)

	cl := b.kafkaClient(t)
	// Neither broker cleans the active segment (the embedded one: the last
	// batch): a record after segment.ms rolls it. Those records are one
	// more account's snapshots, in the reference fold like the rest.
	var (
		next     int64
		lastRoll time.Time
	)
	testenv.WaitFor(t, 3*time.Minute, func() error {
		if time.Since(lastRoll) > 300*time.Millisecond {
			next++
			r := event("roller", next)
			if err := demo.Produce(ctx, cl, b.enc, []demo.Record{r}, nil); err != nil {
				return err
			}
			b.records = append(b.records, r)
			lastRoll = time.Now()
		}
		if !c.Real() {
			c.Fake.Compact()
		}
		n, err := recordsInLog(ctx, cl, c.Topic)
		if err != nil {
			return err
		}
		if n >= produced {
			return fmt.Errorf("%d records in the log, %d produced: not compacted yet", n, produced)
		}
		return nil
	})
	n, err := recordsInLog(ctx, cl, c.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if b.end, err = demo.EndOffsets(ctx, kadm.NewClient(cl), c.Topic); err != nil {
		t.Fatal(err)
	}
	var end int64
	for _, e := range b.end {
		end += e
	}
	if int64(n) >= end {
		t.Fatalf("%d records in a log of %d offsets: the topic was not compacted", n, end)
	}
	t.Logf("%d records produced, %d left after compaction", len(b.records), n)

	run(t, b.engine(t, "compacted", projector.Config{}))
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, b.db.Pool, "compacted", c.Topic, b.end, nil); err != nil {
		t.Fatal(err)
	}
	if err := demo.VerifySnapshots(ctx, b.db.Pool, demo.Fold(b.records)); err != nil {
		t.Fatal(err)
	}
}

// recordsInLog counts the data records (not transaction markers) topic
// holds from its start to its end offsets.
func recordsInLog(ctx context.Context, cl *kgo.Client, topic string) (int, error) {
	ends, err := demo.EndOffsets(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		return 0, err
	}
	n := 0
	err = readLog(ctx, cl, topic, ends, func(*kgo.Record) { n++ })
	return n, err
}
