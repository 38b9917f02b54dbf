package kafkaclient_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/kafkaclient"
)

// A consumer reads only committed records, and the options every client
// is given (TLS, SASL, timeouts) override the ones its role sets.
func TestConsumerOptions(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := kafkaclient.Config{Brokers: []string{"127.0.0.1:1"}, Registerer: reg, Extra: []kgo.Opt{kgo.FetchMaxWait(time.Second)}}
	cl, err := kgo.NewClient(kafkaclient.ConsumerOptions(c, kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ref, err := kgo.NewClient(kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if got, want := cl.OptValue(kgo.FetchIsolationLevel), ref.OptValue(kgo.FetchIsolationLevel); got != want {
		t.Errorf("isolation level %v, want read committed", got)
	}
	if got := cl.OptValue(kgo.FetchMaxWait); got != time.Second {
		t.Errorf("fetch max wait %v, want the extra option's 1s over the role's", got)
	}
	if got := cl.OptValue(kgo.SeedBrokers); len(got.([]string)) != 1 {
		t.Errorf("seed brokers %v, want the one configured", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) == 0 {
		t.Error("no kgo metrics registered with Registerer")
	}
}
