package kafkaclient_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"

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

// Every client of a Config with TLS and SASL dials with that TLS and
// authenticates with that mechanism, whatever its role; without them it
// dials plaintext and does not authenticate.
func TestOptionsCarryTheTransport(t *testing.T) {
	tlsCfg := &tls.Config{ServerName: "kafka.internal", MinVersion: tls.VersionTLS12}
	mech := plain.Auth{User: "u", Pass: "p"}.AsMechanism()
	cl, err := kafkaclient.New(kafkaclient.Config{Brokers: []string{"127.0.0.1:1"}, TLS: tlsCfg, SASL: mech}, kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if got, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config); got == nil || got.ServerName != "kafka.internal" {
		t.Errorf("client TLS config %v, want the configured one", cl.OptValue(kgo.DialTLSConfig))
	}
	if got, _ := cl.OptValue(kgo.SASL).([]sasl.Mechanism); len(got) != 1 || got[0].Name() != "PLAIN" {
		t.Errorf("client SASL %v, want PLAIN", cl.OptValue(kgo.SASL))
	}
	if got := kafkaclient.TransportOptions(kafkaclient.Config{TLS: tlsCfg, SASL: mech}); len(got) != 2 {
		t.Errorf("%d transport options, want TLS and SASL", len(got))
	}

	plainCl, err := kafkaclient.New(kafkaclient.Config{Brokers: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer plainCl.Close()
	if got, _ := plainCl.OptValue(kgo.DialTLSConfig).(*tls.Config); got != nil {
		t.Errorf("client without TLS dials with %v", got)
	}
	if got, _ := plainCl.OptValue(kgo.SASL).([]sasl.Mechanism); len(got) != 0 {
		t.Errorf("client without SASL authenticates with %v", got)
	}
}
