package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
)

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, written as PEM files.
type testPKI struct {
	caFile, certFile, keyFile string
	server                    *tls.Config
	// https serves the server certificate without asking for a
	// client's.
	https *tls.Config
	// client is a config that trusts the CA and presents the client
	// certificate, for the test's own clients.
	client *tls.Config
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "projector test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage, ips ...net.IP) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "projector test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return pair, certPEM, keyPEM
	}
	serverPair, _, _ := leaf(2, x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	clientPair, clientPEM, clientKeyPEM := leaf(3, x509.ExtKeyUsageClientAuth)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	p := &testPKI{
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "client.pem"),
		keyFile:  filepath.Join(dir, "client-key.pem"),
		// The brokers require a client certificate, so that the
		// --kafka-tls-cert-file and --kafka-tls-key-file flags are
		// exercised along with the CA.
		server: &tls.Config{Certificates: []tls.Certificate{serverPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
		https:  &tls.Config{Certificates: []tls.Certificate{serverPair}, MinVersion: tls.VersionTLS12},
		client: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientPair}, MinVersion: tls.VersionTLS12},
	}
	for file, data := range map[string][]byte{
		p.caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		p.certFile: clientPEM,
		p.keyFile:  clientKeyPEM,
	} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// securedKafka is a SASL_SSL cluster: TLS with client certificates, and
// SASL authentication of user "projector" with password secret, by
// SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN.
type securedKafka struct {
	pki     *testPKI
	cluster *kfake.Cluster
	brokers string
}

func newSecuredKafka(t *testing.T, topic string, partitions int) *securedKafka {
	t.Helper()
	pki := newTestPKI(t)
	c := testenv.Kafka(t, topic, partitions, kfake.TLS(pki.server), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "projector", secret), kfake.Superuser("SCRAM-SHA-512", "projector", secret),
		kfake.Superuser("PLAIN", "projector", secret))
	// kfake drops the connection of a failed authentication without a
	// word; Apache Kafka first answers with the error, and that answer
	// is what a user sees, so it is given here for PLAIN, whose request
	// holds the password.
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		parts := bytes.Split(r.(*kmsg.SASLAuthenticateRequest).SASLAuthBytes, []byte{0})
		if len(parts) != 3 || string(parts[2]) == secret {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := "Authentication failed: Invalid username or password"
		resp.ErrorMessage = &msg
		return resp, nil, true
	})
	return &securedKafka{pki: pki, cluster: c, brokers: strings.Join(c.ListenAddrs(), ",")}
}

// flags are the command-line flags of the cluster, with SASL mechanism
// and password.
func (k *securedKafka) flags(mechanism, password string) []string {
	return []string{"--brokers", k.brokers,
		"--kafka-tls-ca-file", k.pki.caFile, "--kafka-tls-cert-file", k.pki.certFile, "--kafka-tls-key-file", k.pki.keyFile,
		"--kafka-sasl-mechanism", mechanism, "--kafka-sasl-username", "projector", "--kafka-sasl-password", password}
}

// client is a client of the test itself on the cluster.
func (k *securedKafka) client(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...), kgo.DialTLSConfig(k.pki.client),
		kgo.SASL(scram.Auth{User: "projector", Pass: secret}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// httpsRegistry is a registry behind TLS with pki's server certificate,
// and its URL.
func httpsRegistry(t *testing.T, pki *testPKI) string {
	t.Helper()
	fake, _ := testenv.Registry(t)
	target, err := url.Parse(fake.URL())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	srv.TLS = pki.https
	// A client that does not trust the CA is expected by one case.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSecuredKafka: against a cluster that takes only TLS with a client
// certificate and SASL, produce, run, status and relay given the
// transport flags do what they do on a plaintext one: the events produced
// are folded into the table as the reference fold says, status shows no
// lag, the relay's event reaches the topic. A wrong password fails naming SASL authentication, and the
// password is printed by none of them.
func TestSecuredKafka(t *testing.T) {
	ctx := t.Context()
	k := newSecuredKafka(t, demo.Topic, 2)
	registry := httpsRegistry(t, k.pki)
	db := testenv.NewDB(t)

	stream := demo.Generate(demo.Options{Aggregates: 40, MeanEvents: 4, Seed: 7})
	sent, lines := jsonLines(t, stream)
	events := writeFile(t, "events.jsonl", lines)
	avsc := filepath.Join("..", "..", "internal", "demo", "account_event.avsc")
	out, err := runCaptured(ctx, append([]string{"produce", "--registry-url", registry, "--topic", demo.Topic,
		"--schema", avsc, "--key-field", "account_id", "--file", events, "--timeout", "20s", "--registry-tls-ca-file", k.pki.caFile}, k.flags("SCRAM-SHA-256", secret)...)...)
	if err != nil {
		t.Fatalf("produce on the secured cluster, with an HTTPS registry: %v\n%s", err, out)
	}
	noSecret(t, "produce", out)
	end, err := demo.EndOffsets(ctx, kadm.NewClient(k.client(t)), demo.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if total := sumOffsets(end); total != int64(len(sent)) {
		t.Fatalf("the topic has %d records, want the %d produced", total, len(sent))
	}

	runCtx, stop := context.WithCancel(ctx)
	var runOut lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- Main(runCtx, append([]string{"run", "--registry-url", registry, "--database-url", db.URL,
			"--identity", "secured", "--http-addr", "", "--log-format", "text", "--registry-tls-ca-file", k.pki.caFile,
			"--config", filepath.Join("..", "..", "examples", "projections.yaml")}, k.flags("SCRAM-SHA-256", secret)...), &runOut, &runOut)
	}()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, db.Pool, "secured", demo.Topic, end, nil); err != nil {
		stop()
		<-done
		t.Fatalf("%v\n%s", err, runOut.String())
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("run: %v\n%s", err, runOut.String())
	}
	noSecret(t, "run", runOut.String())
	if err := demo.Verify(ctx, db.Pool, demo.Table, demo.Fold(sent)); err != nil {
		t.Fatal(err)
	}

	out, err = runCaptured(ctx, append([]string{"status", "--json", "--database-url", db.URL, "--identity", "secured"}, k.flags("SCRAM-SHA-256", secret)...)...)
	if err != nil {
		t.Fatalf("status on the secured cluster: %v\n%s", err, out)
	}
	noSecret(t, "status", out)
	var status []struct {
		Partition     int32 `json:"partition"`
		HighWatermark int64 `json:"high_watermark"`
		Lag           int64 `json:"lag"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if len(status) != len(end) {
		t.Fatalf("status lists %d partitions, want %d:\n%s", len(status), len(end), out)
	}
	for _, s := range status {
		if s.HighWatermark != end[s.Partition] || s.Lag != 0 {
			t.Errorf("status of partition %d: %+v, want log end %d (read through TLS and SASL) and lag 0", s.Partition, s, end[s.Partition])
		}
	}

	t.Run("server name", func(t *testing.T) {
		// The brokers' certificate is for 127.0.0.1: a server name it
		// does not hold is refused, so the flag is what is checked.
		out, err := runCaptured(ctx, append([]string{"status", "--database-url", db.URL, "--identity", "secured", "--kafka-tls-server-name", "kafka.example"}, k.flags("SCRAM-SHA-256", secret)...)...)
		if err == nil || !strings.Contains(out, "kafka.example") {
			t.Errorf("status verified the brokers against a name their certificate does not hold: %v\n%s", err, out)
		}
	})

	t.Run("registry CA", func(t *testing.T) {
		// Without --registry-tls-ca-file the registry's certificate is
		// not trusted: the flag is what made produce work above.
		out, err := runCaptured(ctx, append([]string{"produce", "--registry-url", registry, "--topic", demo.Topic,
			"--schema", avsc, "--key-field", "account_id", "--file", events, "--timeout", "5s"}, k.flags("SCRAM-SHA-256", secret)...)...)
		if err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
			t.Errorf("produce trusted the registry's private CA without --registry-tls-ca-file: %v\n%s", err, out)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		const wrong = "Wr0ng-" + secret
		for _, args := range [][]string{
			{"produce", "--registry-url", registry, "--topic", demo.Topic, "--format", "hex", "--key", "k", "--file", writeFile(t, "one.hex", "0102\n"), "--timeout", "10s"},
			{"status", "--database-url", db.URL, "--identity", "secured"},
		} {
			out, err := runCaptured(ctx, append(args, k.flags("plain", wrong)...)...)
			if err == nil {
				t.Fatalf("%s with a wrong password succeeded:\n%s", args[0], out)
			}
			if !strings.Contains(out, "SASL_AUTHENTICATION_FAILED") || !strings.Contains(out, "check --kafka-sasl-mechanism, --kafka-sasl-username and --kafka-sasl-password") {
				t.Errorf("%s with a wrong password does not say SASL authentication failed and which flags to check:\n%s", args[0], out)
			}
			if strings.Contains(out, wrong) {
				t.Errorf("%s printed the password:\n%s", args[0], out)
			}
		}

		// run keeps trying, as for a broker that is down, and says why.
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		var runOut lockedBuffer
		done := make(chan error, 1)
		go func() {
			done <- Main(runCtx, append([]string{"run", "--registry-url", registry, "--database-url", db.URL,
				"--identity", "wrong-password", "--http-addr", "", "--log-format", "text", "--registry-tls-ca-file", k.pki.caFile,
				"--config", filepath.Join("..", "..", "examples", "projections.yaml")}, k.flags("plain", wrong)...), &runOut, &runOut)
		}()
		// First the client's own error, at once; then, once the member
		// has been out of its group for a while, the engine's warning,
		// which says the brokers answer and refuse the credentials.
		testenv.WaitFor(t, 30*time.Second, testenv.Holds("run logs the SASL authentication failure", func() bool {
			return strings.Contains(runOut.String(), "level=ERROR") && strings.Contains(runOut.String(), "SASL_AUTHENTICATION_FAILED")
		}))
		testenv.WaitFor(t, 30*time.Second, testenv.Holds("run warns that the brokers refuse the credentials", func() bool {
			return strings.Contains(runOut.String(), "refuse this member's SASL credentials")
		}))
		if strings.Contains(runOut.String(), "no Kafka broker answers") {
			t.Errorf("run says no broker answers when the brokers refused its credentials:\n%s", runOut.String())
		}
		stop()
		<-done
		if strings.Contains(runOut.String(), wrong) {
			t.Errorf("run printed the password:\n%s", runOut.String())
		}
	})
	t.Run("relay", func(t *testing.T) {
		if err := outbox.Migrate(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
		payload := []byte{0, 0, 0, 0, 1, 's', 'e', 'c'}
		if err := outbox.AppendPool(ctx, db.Pool, outbox.Event{AggregateType: "account", AggregateID: "acc-relayed", Version: 1,
			Type: "Deposited", Topic: demo.Topic, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		s := start(t, append([]string{"relay", "--http-addr", "", "--database-url", db.URL}, k.flags("scram-sha-256", secret)...)...)
		cl := k.client(t)
		cl.AddConsumeTopics(demo.Topic)
		testenv.WaitFor(t, 30*time.Second, func() error {
			s.running(t)
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			for _, r := range cl.PollFetches(pctx).Records() {
				if string(r.Key) == "acc-relayed" && bytes.Equal(r.Value, payload) {
					return nil
				}
			}
			return fmt.Errorf("the relayed event is not on the secured cluster yet:\n%s", s.out.String())
		})
		noSecret(t, "relay", s.out.String())
	})
}

// TestSASLWithoutTLSWarnsOnce: a command given SASL credentials but no TLS
// warns once, before it connects, naming the mechanism and the flag that
// turns TLS on, and never the password: as a line on stderr, or a warning
// of its log when it has one (relay). With TLS, or without SASL, it says
// nothing of the kind.
func TestSASLWithoutTLSWarnsOnce(t *testing.T) {
	const password = "S3cretPw-of-the-test"
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	deadDB := "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"
	commands := map[string][]string{
		// Each fails after the transport is read, without a cluster.
		"run":    {"run", "--brokers", "127.0.0.1:1", "--registry-url", "http://127.0.0.1:1", "--config", filepath.Join(t.TempDir(), "none.yaml"), "--http-addr", ""},
		"status": {"status", "--brokers", "127.0.0.1:1", "--database-url", deadDB},
		"relay":  {"relay", "--brokers", "127.0.0.1:1", "--database-url", deadDB, "--http-addr", busy.Addr().String(), "--log-format", "text"},
	}
	sasl := func(mech string) []string {
		return []string{"--kafka-sasl-mechanism", mech, "--kafka-sasl-username", "projector", "--kafka-sasl-password", password}
	}
	for name, base := range commands {
		for _, tc := range []struct {
			flags []string
			want  string // "": no warning
		}{
			{sasl("plain"), "SASL PLAIN without TLS: the password crosses the network as it is"},
			{sasl("scram-sha-256"), "SASL SCRAM-SHA-256 without TLS: the records and the authenticated session cross the network unencrypted"},
			{append(sasl("plain"), "--kafka-tls"), ""},
			{nil, ""},
		} {
			args := append(append([]string{}, base...), tc.flags...)
			var out syncBuffer
			err := Main(t.Context(), args, &out, &out)
			if err == nil {
				t.Errorf("projector %s: no error, want one from the missing config, database or port", strings.Join(args, " "))
			}
			all := out.String() + fmt.Sprint(err)
			if strings.Contains(all, password) {
				t.Errorf("projector %s printed the SASL password:\n%s", name, all)
			}
			n := strings.Count(all, "without TLS")
			switch {
			case tc.want == "" && n != 0:
				t.Errorf("projector %s: warned of SASL without TLS, want no warning:\n%s", strings.Join(args, " "), all)
			case tc.want != "" && (n != 1 || !strings.Contains(all, tc.want) || !strings.Contains(all, "--kafka-tls (PROJECTOR_KAFKA_TLS) connects over TLS")):
				t.Errorf("projector %s: want the warning %q once, naming --kafka-tls; got %d:\n%s", strings.Join(args, " "), tc.want, n, all)
			}
		}
	}

	// A command that checks its transport first and builds its client
	// later (status) still says it once.
	var c common
	var buf bytes.Buffer
	c.brokers, c.saslMechanism, c.saslUsername, c.saslPassword, c.warnTo = "127.0.0.1:1", "plain", "projector", password, &buf
	if err := c.checkTransport(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.kafkaConfig(nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "without TLS"); n != 1 {
		t.Errorf("checkTransport then kafkaConfig warned %d times, want once:\n%s", n, buf.String())
	}
}
