package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// TestStatusColumns: projector status shows what kafka-consumer-groups
// --describe does, and the age of each partition's oldest record not
// applied, when its backlog drains, the owner epoch and the state: of a
// partition caught up, one an hour behind and one nothing is stored of
// (listed from the topic's partitions), each with the group member it is
// assigned to. Without an answering broker it still shows the stored
// offsets, with - where Kafka is needed.
func TestStatusColumns(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	cluster := testenv.Kafka(t, demo.Topic, 3)
	brokers := cluster.ListenAddrs()[0]
	config := filepath.Join(t.TempDir(), "projections.yaml")
	if err := os.WriteFile(config, demo.Projections, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Main(ctx, []string{"migrate", "--database-url", db.URL, "--config", config}, &out, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, &out)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	old := time.Now().Add(-time.Hour)
	for p := range int32(3) {
		for i := range 5 {
			r := &kgo.Record{Topic: demo.Topic, Partition: p, Value: []byte("x"), Timestamp: old.Add(time.Duration(i) * time.Minute)}
			if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Partition 0 applied to its end, partition 1 to offset 2 (the record
	// there is 58 minutes old); nothing stored of partition 2.
	offsets := postgres.NewOffsets(db.Pool, "cols")
	claims, err := offsets.Claim(ctx, []sinks.TP{{Topic: demo.Topic, Partition: 0}, {Topic: demo.Topic, Partition: 1}})
	if err != nil {
		t.Fatal(err)
	}
	firsts := make([]int64, len(claims))
	for i, c := range claims {
		firsts[i] = map[int32]int64{0: 5, 1: 2}[c.Partition]
	}
	if _, err := offsets.InitAll(ctx, claims, firsts); err != nil {
		t.Fatal(err)
	}
	// A member of the group, assigned every partition.
	member, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumerGroup("cols"), kgo.ConsumeTopics(demo.Topic), kgo.ClientID("status-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	adm := kadm.NewClient(prod)
	testenv.WaitFor(t, 20*time.Second, testenv.Holds("the member to be assigned the 3 partitions", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		member.PollFetches(pctx)
		cancel()
		d, err := adm.DescribeGroups(ctx, "cols")
		return err == nil && len(d.AssignedPartitions()[demo.Topic]) == 3
	}))
	memberID, _ := member.GroupMetadata()

	status := func(args ...string) (string, string) {
		t.Helper()
		var out, errs bytes.Buffer
		if err := Main(ctx, append([]string{"status", "--database-url", db.URL, "--identity", "cols", "--config", config}, args...), &out, &errs); err != nil {
			t.Fatalf("status: %v\n%s", err, &errs)
		}
		return out.String(), errs.String()
	}
	js, _ := status("--brokers", brokers, "--json", "--sample", "0")
	var rows []partitionStatus
	if err := json.Unmarshal([]byte(js), &rows); err != nil {
		t.Fatalf("%v\n%s", err, js)
	}
	if len(rows) != 3 {
		t.Fatalf("status --json: %d rows, want one per partition of the topic:\n%s", len(rows), js)
	}
	for _, r := range rows {
		if r.ConsumerID != memberID || r.ClientID != "status-test" || r.Host == "" || r.Group != "cols" {
			t.Errorf("partition %d: consumer %q client %q host %q group %q, want the member %q, client status-test, its host, group cols", r.Partition, r.ConsumerID, r.ClientID, r.Host, r.Group, memberID)
		}
		if r.DrainSeconds != nil || r.NeverDrains {
			t.Errorf("partition %d: a drain estimate without --sample", r.Partition)
		}
	}
	if r := rows[0]; r.Lag == nil || *r.Lag != 0 || r.LagSeconds == nil || *r.LagSeconds != 0 || r.State != stateOK {
		t.Errorf("partition 0 caught up: %s", js)
	}
	if r := rows[1]; r.Lag == nil || *r.Lag != 3 || r.LagSeconds == nil || *r.LagSeconds < 58*60 || *r.LagSeconds > 58*60+120 {
		t.Errorf("partition 1, behind from a record 58 minutes old: lag %v, lag_seconds %v:\n%s", r.Lag, r.LagSeconds, js)
	}
	if r := rows[2]; r.Partition != 2 || r.NextOffset != nil || r.State != stateUnstarted || r.HighWatermark == nil || *r.HighWatermark != 5 {
		t.Errorf("partition 2, nothing stored: %s", js)
	}

	table, _ := status("--brokers", brokers, "--sample", "100ms")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	want := "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID LAG-SECONDS DRAIN OWNER-EPOCH STATE"
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != want {
		t.Fatalf("status table: want the header %q and 3 rows:\n%s", want, table)
	}
	// Nothing moved while it watched: the backlog never drains.
	for _, l := range lines[1:] {
		if f := strings.Fields(l); f[6] != memberID || f[8] != "status-test" || f[10] != "never" {
			t.Errorf("status row %q: want the member, its client id and DRAIN never", l)
		}
	}

	// No broker answers: the stored offsets, and - where Kafka is needed.
	table, errs := status("--brokers", "127.0.0.1:1")
	if !strings.Contains(errs, "did not answer") {
		t.Errorf("status without an answering broker says %q, want that Kafka did not answer", errs)
	}
	lines = strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 {
		t.Fatalf("status without a broker: want the 2 stored partitions:\n%s", table)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if f[3] == "-" || f[4] != "-" || f[5] != "-" || f[6] != "-" || f[9] != "-" || f[10] != "-" || f[12] != stateLogNotAsked {
			t.Errorf("status row %q without a broker: want the stored offset, - for the log end, lag, member, age and drain, state %s", l, stateLogNotAsked)
		}
	}
}
