package embedded

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestKcatCompressesIntoEmbeddedBroker produces through kcat (librdkafka)
// with each codec librdkafka 2.x stopped using against kfake's Produce
// range, and reads the batches back: every record arrives, in a batch
// compressed with the codec asked for, not silently sent uncompressed.
func TestKcatCompressesIntoEmbeddedBroker(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Skip("kcat is not installed (apt-get install kcat; CI installs it): the embedded broker's answer to librdkafka producers is untested")
	}
	codecs := []struct {
		name string
		attr uint8 // the record batch's compression attribute
	}{{"gzip", 1}, {"snappy", 2}, {"lz4", 3}}
	var topics []string
	for _, c := range codecs {
		topics = append(topics, "events."+c.name)
	}
	c, err := NewBroker(t.Context(), BrokerConfig{Topics: topics, Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := c.ListenAddrs()[0]

	const n = 50
	for _, codec := range codecs {
		topic := "events." + codec.name
		var lines strings.Builder
		for i := range n {
			// Repetitive values, so that every codec shrinks them.
			fmt.Fprintf(&lines, "acct-%d:{\"id\":%d,\"note\":\"%s\"}\n", i%5, i, strings.Repeat("abc", 40))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		cmd := exec.CommandContext(ctx, kcat, "-P", "-b", addr, "-t", topic, "-K", ":", "-z", codec.name,
			"-X", "linger.ms=50", "-X", "broker.address.family=v4")
		cmd.Stdin = strings.NewReader(lines.String())
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("kcat -z %s: %v\n%s", codec.name, err, out)
		}

		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		var got []*kgo.Record
		deadline := time.Now().Add(20 * time.Second)
		for len(got) < n && time.Now().Before(deadline) {
			fctx, cancel := context.WithTimeout(t.Context(), time.Second)
			fs := cl.PollFetches(fctx)
			cancel()
			got = append(got, fs.Records()...)
		}
		cl.Close()
		if len(got) != n {
			t.Fatalf("%s: read back %d of the %d records kcat produced", codec.name, len(got), n)
		}
		for _, r := range got {
			if ct := r.Attrs.CompressionType(); ct != codec.attr {
				t.Fatalf("%s: record at offset %d is in a batch with compression %d, want %d (%s): librdkafka did not compress",
					codec.name, r.Offset, ct, codec.attr, codec.name)
			}
		}
		if k, v := string(got[7].Key), string(got[7].Value); k != "acct-2" || !strings.HasPrefix(v, `{"id":7,`) {
			t.Errorf("%s: record 7 is %s:%s, want acct-2:{\"id\":7,...}", codec.name, k, v)
		}
	}
}
