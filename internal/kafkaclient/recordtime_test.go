package kafkaclient_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/internal/testenv"
)

// RecordTimes reads the timestamp of the record at an offset, which is
// how old a partition's oldest uncommitted record is when no consumer
// fetches it: of each partition asked, the record at the offset (not the
// log's first), and nothing for an offset at the log end or one deleted.
func TestRecordTimes(t *testing.T) {
	c := testenv.NewCluster(t, "times", 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	for p := range int32(2) {
		for i := range 5 {
			r := &kgo.Record{Topic: c.Topic, Partition: p, Value: []byte("x"), Timestamp: base.Add(time.Duration(int(p)*100+i) * time.Second)}
			if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := kafkaclient.RecordTimes(t.Context(), cl, map[string]map[int32]int64{c.Topic: {0: 3, 1: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if ts, want := got[c.Topic][0], base.Add(3*time.Second); !ts.Equal(want) {
		t.Errorf("partition 0 at offset 3: %v, want the fourth record's %v", ts, want)
	}
	if ts, ok := got[c.Topic][1]; ok {
		t.Errorf("partition 1 at its log end: %v, want none", ts)
	}
	c.DeleteRecords(c.Topic, 0, 2)
	got, err = kafkaclient.RecordTimes(t.Context(), cl, map[string]map[int32]int64{c.Topic: {0: 1, 1: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if ts, ok := got[c.Topic][0]; ok {
		t.Errorf("partition 0 at a deleted offset: %v, want none", ts)
	}
	if ts, want := got[c.Topic][1], base.Add(100*time.Second); !ts.Equal(want) {
		t.Errorf("partition 1 at offset 0: %v, want %v", ts, want)
	}
}
