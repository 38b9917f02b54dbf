package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// The tests of this file log in to the SASL listener of Apache Kafka
// (scripts/kafka up --sasl), which checks the credentials itself; the
// test's topics are created, and read, through the cluster's plaintext
// listener.

// realLogin is a test's Apache Kafka with a SASL listener: its topic, a
// database, a registry, and the records of a demo stream as JSON lines
// for produce.
type realLogin struct {
	kafka    *testenv.Cluster
	sasl     string // the SASL listeners, for --brokers
	db       *testenv.DB
	registry string
	config   string // projections.yaml on the test's topic
	lines    []string
	sent     []demo.Record
}

func newRealLogin(t *testing.T) *realLogin {
	t.Helper()
	sasl := testenv.RealKafkaSASL(t)
	kafka := testenv.NewCluster(t, demo.Topic, 2)
	fake, _ := testenv.Registry(t)
	sent, lines := jsonLines(t, demo.Generate(demo.Options{Aggregates: 30, MeanEvents: 4, Seed: 13}))
	return &realLogin{kafka: kafka, sasl: sasl, db: testenv.NewDB(t), registry: fake.URL(),
		config: writeFile(t, "projections.yaml", strings.ReplaceAll(string(demo.Projections), demo.Topic, kafka.Topic)),
		lines:  strings.SplitAfter(strings.TrimSuffix(lines, "\n"), "\n"),
		sent:   sent,
	}
}

// produce runs projector produce of lines with the login flags.
func (r *realLogin) produce(t *testing.T, lines []string, login []string) {
	t.Helper()
	avsc := filepath.Join("..", "..", "internal", "demo", "account_event.avsc")
	out, err := runCaptured(t.Context(), append([]string{"produce", "--registry-url", r.registry, "--topic", r.kafka.Topic,
		"--schema", avsc, "--key-field", "account_id", "--file", writeFile(t, "events.jsonl", strings.Join(lines, "")), "--timeout", "30s",
		"--brokers", r.sasl}, login...)...)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	noSecret(t, "produce", out)
}

// run starts projector run with the login flags.
func (r *realLogin) run(t *testing.T, identity string, login []string) *started {
	return start(t, append([]string{"run", "--registry-url", r.registry, "--database-url", r.db.URL, "--identity", identity,
		"--http-addr", "", "--log-format", "text", "--config", r.config, "--brokers", r.sasl}, login...)...)
}

// waitCommitted waits until the member of identity has stored the log end
// of every partition.
func (r *realLogin) waitCommitted(t *testing.T, identity string, s *started) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	end, err := demo.EndOffsets(t.Context(), kadm.NewClient(cl), r.kafka.Topic)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(ctx, r.db.Pool, identity, r.kafka.Topic, end, nil); err != nil {
		t.Fatalf("%v\n%s", err, s.out.String())
	}
}

// TestRealKafkaSCRAMSHA512: on Apache Kafka's SCRAM-SHA-512 listener,
// with the password in --kafka-sasl-password-file, produce, run and
// status work (the events are folded as the reference fold says, status
// shows no lag); a wrong password stops status with Kafka's refusal and
// which flags to check, in two lines, never printing it.
func TestRealKafkaSCRAMSHA512(t *testing.T) {
	r := newRealLogin(t)
	pwFile := filepath.Join(t.TempDir(), "password")
	writeSecret(t, pwFile, testenv.KafkaSASLPassword)
	login := []string{"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", testenv.KafkaSASLUser, "--kafka-sasl-password-file", pwFile}
	identity := r.kafka.Name("scram")

	r.produce(t, r.lines, login)
	s := r.run(t, identity, login)
	r.waitCommitted(t, identity, s)
	s.stop()
	if err := s.exited(t, 30*time.Second); err != nil {
		t.Errorf("run: %v\n%s", err, s.out.String())
	}
	if err := demo.Verify(t.Context(), r.db.Pool, demo.Table, demo.Fold(r.sent)); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr lockedBuffer
	if err := Main(t.Context(), append([]string{"status", "--json", "--database-url", r.db.URL, "--identity", identity, "--brokers", r.sasl}, login...), &stdout, &stderr); err != nil {
		t.Fatalf("status: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	var status []struct {
		Topic string `json:"topic"`
		Lag   int64  `json:"lag"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if len(status) != 2 {
		t.Fatalf("status lists %d partitions, want 2:\n%s", len(status), out)
	}
	for _, st := range status {
		if st.Lag != 0 {
			t.Errorf("status: %+v, want lag 0", st)
		}
	}

	wrong := filepath.Join(t.TempDir(), "wrong")
	writeSecret(t, wrong, "Wr0ng-"+secret)
	out, err := runCaptured(t.Context(), "status", "--database-url", r.db.URL, "--identity", identity, "--brokers", r.sasl,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", testenv.KafkaSASLUser, "--kafka-sasl-password-file", wrong)
	if err == nil {
		t.Fatalf("status with a wrong password succeeded:\n%s", out)
	}
	msg := err.Error()
	if !strings.Contains(msg, "SASL_AUTHENTICATION_FAILED") || !strings.Contains(msg, "check --kafka-sasl-mechanism, --kafka-sasl-username and --kafka-sasl-password or its -file") ||
		strings.Count(msg, "\n") > 1 {
		t.Errorf("status with a wrong password: want Kafka's refusal and the flags to check, in two lines:\n%s", msg)
	}
	noSecret(t, "status", out)
}

// unsecuredJWT is a token Kafka's unsecured OAUTHBEARER validator takes:
// unsigned (alg none), for principal sub, expiring at exp.
func unsecuredJWT(sub string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims := fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, sub, time.Now().Add(-time.Second).Unix(), exp.Unix())
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(claims)) + "."
}

// TestRealKafkaOAuthBearerRenewedToken: a member logged in with an
// OAUTHBEARER token that expires within seconds keeps consuming after it
// has expired, because the token renewed in --kafka-sasl-oauth-token-file
// is what its re-authentications send (Kafka ends a session at its
// token's expiry and refuses an expired token); a token Kafka refuses
// stops produce with its reason in two lines.
func TestRealKafkaOAuthBearerRenewedToken(t *testing.T) {
	r := newRealLogin(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	firstExpiry := time.Now().Add(12 * time.Second)
	writeSecret(t, tokenFile, unsecuredJWT("projector", firstExpiry))
	login := []string{"--kafka-sasl-mechanism", "oauthbearer", "--kafka-sasl-oauth-token-file", tokenFile}
	identity := r.kafka.Name("oauth")

	half := len(r.lines) / 2
	r.produce(t, r.lines[:half], login)
	s := r.run(t, identity, login)
	r.waitCommitted(t, identity, s)

	// The token is renewed in its file before it expires, as a sidecar
	// or a projected service account token is.
	writeSecret(t, tokenFile, unsecuredJWT("projector", time.Now().Add(10*time.Minute)))
	testenv.WaitFor(t, time.Minute, testenv.Holds("the first token has expired", func() bool {
		return time.Now().After(firstExpiry.Add(2 * time.Second))
	}))
	r.produce(t, r.lines[half:], login)
	r.waitCommitted(t, identity, s)
	s.running(t)
	s.stop()
	if err := s.exited(t, 30*time.Second); err != nil {
		t.Errorf("run: %v\n%s", err, s.out.String())
	}
	if strings.Contains(s.out.String(), "SASL_AUTHENTICATION_FAILED") {
		t.Errorf("run was refused a login while its token was renewed:\n%s", s.out.String())
	}
	if err := demo.Verify(t.Context(), r.db.Pool, demo.Table, demo.Fold(r.sent)); err != nil {
		t.Fatal(err)
	}

	expired := unsecuredJWT("projector", time.Now().Add(-time.Minute))
	writeSecret(t, tokenFile, expired)
	out, err := runCaptured(t.Context(), "produce", "--registry-url", r.registry, "--topic", r.kafka.Topic, "--format", "hex", "--key", "k",
		"--file", writeFile(t, "one.hex", "0102\n"), "--timeout", "15s", "--brokers", r.sasl, "--kafka-sasl-mechanism", "oauthbearer", "--kafka-sasl-oauth-token-file", tokenFile)
	if err == nil {
		t.Fatalf("produce with an expired token succeeded:\n%s", out)
	}
	msg := err.Error()
	if !strings.Contains(msg, "SASL_AUTHENTICATION_FAILED") || !strings.Contains(msg, "--kafka-sasl-oauth-token-file") || strings.Count(msg, "\n") > 1 {
		t.Errorf("produce with an expired token: want Kafka's refusal and the flag to check, in two lines:\n%s", msg)
	}
	if strings.Contains(out, expired) {
		t.Errorf("produce printed the token:\n%s", out)
	}
}
