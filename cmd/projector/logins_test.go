package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
)

// writeSecret writes a secret file the way a Kubernetes secret volume
// or echo leaves it: with a trailing newline, which is not part of it.
func writeSecret(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestKafkaSCRAMSHA512EndToEnd: over TLS with a client certificate and
// SCRAM-SHA-512, the password read from --kafka-sasl-password-file,
// produce, run and status do what they do on a plaintext cluster: the
// events produced are folded into the table as the reference fold says
// and status shows no lag.
func TestKafkaSCRAMSHA512EndToEnd(t *testing.T) {
	ctx := t.Context()
	k := newSecuredKafka(t, demo.Topic, 2)
	registry := httpsRegistry(t, k.pki)
	db := testenv.NewDB(t)
	pwFile := filepath.Join(t.TempDir(), "kafka-password")
	writeSecret(t, pwFile, secret)
	flags := []string{"--brokers", k.brokers,
		"--kafka-tls-ca-file", k.pki.caFile, "--kafka-tls-cert-file", k.pki.certFile, "--kafka-tls-key-file", k.pki.keyFile,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "projector", "--kafka-sasl-password-file", pwFile}

	stream := demo.Generate(demo.Options{Aggregates: 30, MeanEvents: 4, Seed: 11})
	sent, lines := jsonLines(t, stream)
	events := writeFile(t, "events.jsonl", lines)
	avsc := filepath.Join("..", "..", "internal", "demo", "account_event.avsc")
	out, err := runCaptured(ctx, append([]string{"produce", "--registry-url", registry, "--topic", demo.Topic,
		"--schema", avsc, "--key-field", "account_id", "--file", events, "--timeout", "20s", "--registry-tls-ca-file", k.pki.caFile}, flags...)...)
	if err != nil {
		t.Fatalf("produce with SCRAM-SHA-512: %v\n%s", err, out)
	}
	noSecret(t, "produce", out)
	end, err := demo.EndOffsets(ctx, kadm.NewClient(k.client(t)), demo.Topic)
	if err != nil {
		t.Fatal(err)
	}
	if total := sumOffsets(end); total != int64(len(sent)) {
		t.Fatalf("the topic has %d records, want the %d produced", total, len(sent))
	}

	s := start(t, append([]string{"run", "--registry-url", registry, "--database-url", db.URL,
		"--identity", "scram512", "--http-addr", "", "--log-format", "text", "--registry-tls-ca-file", k.pki.caFile,
		"--config", filepath.Join("..", "..", "examples", "projections.yaml")}, flags...)...)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, db.Pool, "scram512", demo.Topic, end, nil); err != nil {
		t.Fatalf("%v\n%s", err, s.out.String())
	}
	s.stop()
	if err := s.exited(t, 30*time.Second); err != nil {
		t.Errorf("run: %v\n%s", err, s.out.String())
	}
	noSecret(t, "run", s.out.String())
	if err := demo.Verify(ctx, db.Pool, demo.Table, demo.Fold(sent)); err != nil {
		t.Fatal(err)
	}

	out, err = runCaptured(ctx, append([]string{"status", "--json", "--database-url", db.URL, "--identity", "scram512"}, flags...)...)
	if err != nil {
		t.Fatalf("status with SCRAM-SHA-512: %v\n%s", err, out)
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
	for _, st := range status {
		if st.HighWatermark != end[st.Partition] || st.Lag != 0 {
			t.Errorf("status of partition %d: %+v, want log end %d and lag 0", st.Partition, st, end[st.Partition])
		}
	}
}

// TestKafkaPasswordFileReadAtEachLogin: the mechanism built from
// --kafka-sasl-password-file reads the file at each login, so that after
// the password is changed on the cluster and in the file, a new
// connection of the same process logs in with the new one.
func TestKafkaPasswordFileReadAtEachLogin(t *testing.T) {
	c := testenv.Kafka(t, "t", 1, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "projector", "first-"+secret))
	pwFile := filepath.Join(t.TempDir(), "kafka-password")
	writeSecret(t, pwFile, "first-"+secret)
	k := kafkaTransport{saslMechanism: "scram-sha-512", saslUsername: "projector", saslPasswordFile: pwFile, warnTo: &bytes.Buffer{}}
	mech, err := k.kafkaSASL()
	if err != nil {
		t.Fatal(err)
	}
	ping := func() error {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(mech), kgo.RetryTimeout(3*time.Second))
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err = kadm.NewClient(cl).ListTopics(ctx)
		return err
	}
	if err := ping(); err != nil {
		t.Fatalf("login with the password of the file: %v", err)
	}

	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(scram.Auth{User: "projector", Pass: "first-" + secret}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	res, err := kadm.NewClient(admin).AlterUserSCRAMs(t.Context(), nil, []kadm.UpsertSCRAM{{User: "projector", Mechanism: kadm.ScramSha512, Iterations: 4096, Password: "second-" + secret}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("change the password on the cluster: %v", err)
	}
	if err := ping(); err == nil {
		t.Fatal("the old password still logs in: the cluster did not change it, and the test proves nothing")
	}
	writeSecret(t, pwFile, "second-"+secret)
	if err := ping(); err != nil {
		t.Fatalf("after the file was rotated, a new connection did not log in with its password: %v", err)
	}
}

// saslBroker stands for a broker's SASL authentication, which kfake does
// not implement for OAUTHBEARER and AWS_MSK_IAM: it answers the
// handshake for mechanism and hands each authentication's bytes to
// check, refusing the login with check's error as Apache Kafka does.
// Sessions last lifetime, so that clients re-authenticate.
type saslBroker struct {
	mu     sync.Mutex
	logins []string // what check returned for each accepted login
}

func newSASLBroker(c *kfake.Cluster, mechanism string, lifetime time.Duration, check func(auth []byte) (string, []byte, error)) *saslBroker {
	b := &saslBroker{}
	c.ControlKey(int16(kmsg.SASLHandshake), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := r.(*kmsg.SASLHandshakeRequest)
		resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
		resp.SupportedMechanisms = []string{mechanism}
		if req.Mechanism != mechanism {
			resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		}
		return resp, nil, true
	})
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := r.(*kmsg.SASLAuthenticateRequest)
		resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		who, reply, err := check(req.SASLAuthBytes)
		if err != nil {
			resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
			msg := "Authentication failed: " + err.Error()
			resp.ErrorMessage = &msg
			return resp, nil, true
		}
		b.mu.Lock()
		b.logins = append(b.logins, who)
		b.mu.Unlock()
		resp.SASLAuthBytes = reply
		resp.SessionLifetimeMillis = lifetime.Milliseconds()
		return resp, nil, true
	})
	return b
}

// seen reports whether a login was accepted for who.
func (b *saslBroker) seen(who string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.logins {
		if l == who {
			return true
		}
	}
	return false
}

// count is how many logins were accepted.
func (b *saslBroker) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.logins)
}

// oauthTokens is the set of OAUTHBEARER oauthTokens a test's broker accepts.
type oauthTokens struct {
	mu    sync.Mutex
	valid map[string]bool
}

func (ts *oauthTokens) set(valid ...string) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.valid = map[string]bool{}
	for _, v := range valid {
		ts.valid[v] = true
	}
}

// check reads an OAUTHBEARER client's first message (RFC 7628: the GS2
// header, then auth=Bearer <token>, separated by ^A).
func (ts *oauthTokens) check(auth []byte) (string, []byte, error) {
	var token string
	for _, kv := range strings.Split(string(auth), "\x01") {
		if v, ok := strings.CutPrefix(kv, "auth=Bearer "); ok {
			token = v
		}
		if v, ok := strings.CutPrefix(kv, "logicalCluster="); ok && v != "lkc-test" {
			return "", nil, fmt.Errorf("logical cluster %s, want lkc-test", v)
		}
	}
	if !bytes.Contains(auth, []byte("\x01logicalCluster=lkc-test\x01")) {
		return "", nil, errors.New("no logicalCluster extension")
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if token == "" || !ts.valid[token] {
		return "", nil, errors.New("invalid or expired token")
	}
	return token, nil, nil
}

// TestKafkaOAuthBearer: with --kafka-sasl-mechanism oauthbearer the
// commands log in with the token of --kafka-sasl-oauth-token-file and the
// extensions of --kafka-sasl-oauth-extensions (the broker refuses a login
// without them); a
// token renewed in the file is used at the next re-authentication, so a
// running client keeps working after the first token has expired; a
// token the brokers refuse fails the command with the broker's reason and
// which flags to check.
func TestKafkaOAuthBearer(t *testing.T) {
	ctx := t.Context()
	c := testenv.Kafka(t, "logins", 1)
	var valid oauthTokens
	valid.set("token-one")
	broker := newSASLBroker(c, "OAUTHBEARER", 2*time.Second, valid.check)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeSecret(t, tokenFile, "token-one")
	fake, _ := testenv.Registry(t)
	oauth := []string{"--brokers", strings.Join(c.ListenAddrs(), ","), "--kafka-sasl-mechanism", "oauthbearer", "--kafka-sasl-oauth-token-file", tokenFile,
		"--kafka-sasl-oauth-extensions", "logicalCluster=lkc-test"}
	hexFile := writeFile(t, "one.hex", "0102\n")
	produce := append([]string{"produce", "--registry-url", fake.URL(), "--topic", "logins", "--format", "hex", "--key", "k", "--file", hexFile, "--timeout", "10s"}, oauth...)

	out, err := runCaptured(ctx, produce...)
	if err != nil {
		t.Fatalf("produce with OAUTHBEARER: %v\n%s", err, out)
	}
	if !broker.seen("token-one") {
		t.Fatalf("the broker saw no login with the token of the file")
	}
	if strings.Count(out, "SASL OAUTHBEARER without TLS: the token crosses the network as it is") != 1 {
		t.Errorf("produce did not warn once that the token crosses the network unencrypted:\n%s", out)
	}

	t.Run("renewed token", func(t *testing.T) {
		k := kafkaTransport{saslMechanism: "oauthbearer", saslTokenFile: tokenFile, saslExtensions: "logicalCluster=lkc-test", warnTo: &bytes.Buffer{}}
		mech, err := k.kafkaSASL()
		if err != nil {
			t.Fatal(err)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(mech), kgo.DefaultProduceTopic("logins"))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		// The token is renewed in the file and the first one expires:
		// the client's next re-authentication must use the new one.
		writeSecret(t, tokenFile, "token-two")
		valid.set("token-two")
		testenv.WaitFor(t, 30*time.Second, func() error {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := cl.ProduceSync(pctx, &kgo.Record{Value: []byte("after")}).FirstErr(); err != nil {
				return err
			}
			if !broker.seen("token-two") {
				return errors.New("no re-authentication with the renewed token yet")
			}
			return nil
		})
	})

	t.Run("refused token", func(t *testing.T) {
		writeSecret(t, tokenFile, "token-revoked")
		out, err := runCaptured(ctx, produce...)
		if err == nil {
			t.Fatalf("produce with a refused token succeeded:\n%s", out)
		}
		for _, want := range []string{"SASL_AUTHENTICATION_FAILED", "invalid or expired token", "--kafka-sasl-oauth-token-file"} {
			if !strings.Contains(out, want) {
				t.Errorf("produce with a refused token does not say %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "token-revoked") {
			t.Errorf("produce printed the token:\n%s", out)
		}
	})
}

// mskSigned checks an AWS_MSK_IAM authentication payload the way the
// MSK brokers do, for the access keys of secrets (access key ID → secret
// key): a JSON object of a SigV4 pre-signed kafka-cluster:Connect request
// for host, in region, whose signature is the one the secret key makes.
// It returns the access key ID that signed.
func mskSigned(payload []byte, host, region string, secrets func(id string) (string, bool)) (string, error) {
	var kv map[string]string
	if err := json.Unmarshal(payload, &kv); err != nil {
		return "", fmt.Errorf("payload is not a JSON object of strings: %v", err)
	}
	if kv["version"] != "2020_10_22" || kv["action"] != "kafka-cluster:Connect" || kv["host"] != host ||
		kv["x-amz-algorithm"] != "AWS4-HMAC-SHA256" || kv["x-amz-signedheaders"] != "host" || kv["user-agent"] == "" {
		return "", fmt.Errorf("malformed payload %v", kv)
	}
	cred := strings.Split(kv["x-amz-credential"], "/")
	if len(cred) != 5 || cred[2] != region || cred[3] != "kafka-cluster" || cred[4] != "aws4_request" || !strings.HasPrefix(kv["x-amz-date"], cred[1]) {
		return "", fmt.Errorf("credential scope %q, want <key>/<date>/%s/kafka-cluster/aws4_request", kv["x-amz-credential"], region)
	}
	id := cred[0]
	secretKey, ok := secrets(id)
	if !ok {
		return "", fmt.Errorf("unknown access key %s", id)
	}
	// The canonical request of AWS Signature Version 4, for a GET of /
	// with the query parameters and the signed host header.
	q := url.Values{}
	for _, name := range []string{"Action", "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Security-Token"} {
		if v, ok := kv[strings.ToLower(name)]; ok {
			q.Set(name, v)
		}
	}
	emptyHash := sha256.Sum256(nil)
	canonical := "GET\n/\n" + strings.ReplaceAll(q.Encode(), "+", "%20") + "\nhost:" + host + "\n\nhost\n" + hex.EncodeToString(emptyHash[:])
	ch := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + kv["x-amz-date"] + "\n" + strings.Join(cred[1:], "/") + "\n" + hex.EncodeToString(ch[:])
	mac := func(key []byte, data string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(data))
		return h.Sum(nil)
	}
	key := mac([]byte("AWS4"+secretKey), cred[1])
	key = mac(key, region)
	key = mac(key, "kafka-cluster")
	key = mac(key, "aws4_request")
	if want := hex.EncodeToString(mac(key, toSign)); kv["x-amz-signature"] != want {
		return "", fmt.Errorf("signature of %s does not verify with its secret key", id)
	}
	return id, nil
}

// awsEnv gives the test an AWS environment of its own: no credentials
// but those it sets, no instance metadata service, the region.
func awsEnv(t *testing.T, region string) string {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
		"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_DEFAULT_REGION"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(home, "aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(home, "aws-credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_REGION", region)
	return home
}

// TestKafkaAWSMSKIAM: with --kafka-sasl-mechanism aws-msk-iam the
// commands log in with an AWS_MSK_IAM payload that the broker's check
// accepts: signed, for the broker's host and the region, with the
// credentials the AWS SDK's default chain finds (here the environment
// variables, then the shared credentials file); a key rotated in that
// file is used at the next re-authentication of a running client; no
// credentials at all stop the command before it connects, saying where
// they are looked for.
func TestKafkaAWSMSKIAM(t *testing.T) {
	ctx := t.Context()
	const region = "eu-west-1"
	home := awsEnv(t, region)
	c := testenv.Kafka(t, "logins", 1)
	host, _, err := net.SplitHostPort(c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	keys := map[string]string{"AKIAENVIRONMENT": "env-" + secret}
	broker := newSASLBroker(c, "AWS_MSK_IAM", 2*time.Second, func(auth []byte) (string, []byte, error) {
		id, err := mskSigned(auth, host, region, func(id string) (string, bool) {
			mu.Lock()
			defer mu.Unlock()
			s, ok := keys[id]
			return s, ok
		})
		// MSK answers a login with a JSON object; the client wants it
		// not empty.
		return id, []byte(`{"version":"2020_10_22","request-id":"test"}`), err
	})
	fake, _ := testenv.Registry(t)
	iam := []string{"--brokers", strings.Join(c.ListenAddrs(), ","), "--kafka-sasl-mechanism", "aws-msk-iam"}
	produce := append([]string{"produce", "--registry-url", fake.URL(), "--topic", "logins", "--format", "hex", "--key", "k",
		"--file", writeFile(t, "one.hex", "0102\n"), "--timeout", "10s"}, iam...)

	t.Run("no credentials", func(t *testing.T) {
		out, err := runCaptured(ctx, produce...)
		if err == nil {
			t.Fatalf("produce without AWS credentials succeeded:\n%s", out)
		}
		if !strings.Contains(out, "--kafka-sasl-mechanism aws-msk-iam: no AWS credentials found") || strings.Count(strings.TrimSpace(out), "\n") > 1 {
			t.Errorf("produce without AWS credentials does not say so in a line or two:\n%s", out)
		}
		if broker.count() > 0 {
			t.Errorf("produce connected without credentials")
		}
	})

	t.Run("environment", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "env-"+secret)
		out, err := runCaptured(ctx, produce...)
		if err != nil {
			t.Fatalf("produce with AWS credentials in the environment: %v\n%s", err, out)
		}
		if !broker.seen("AKIAENVIRONMENT") {
			t.Fatal("the broker saw no login signed with the environment's key")
		}
		noSecret(t, "produce", out)
	})

	t.Run("rotated shared credentials file", func(t *testing.T) {
		credFile := filepath.Join(home, "aws-credentials")
		writeKey := func(id, secretKey string) {
			mu.Lock()
			keys = map[string]string{id: secretKey} // the previous key is deactivated
			mu.Unlock()
			if err := os.WriteFile(credFile, []byte("[default]\naws_access_key_id = "+id+"\naws_secret_access_key = "+secretKey+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		writeKey("AKIAFIRSTKEY", "first-"+secret)
		k := kafkaTransport{saslMechanism: "aws-msk-iam", warnTo: &bytes.Buffer{}}
		mech, err := k.kafkaSASL()
		if err != nil {
			t.Fatal(err)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(mech), kgo.DefaultProduceTopic("logins"))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if !broker.seen("AKIAFIRSTKEY") {
			t.Fatal("the broker saw no login signed with the shared file's key")
		}
		writeKey("AKIASECONDKEYROTATED", "second-"+secret)
		testenv.WaitFor(t, 30*time.Second, func() error {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := cl.ProduceSync(pctx, &kgo.Record{Value: []byte("after")}).FirstErr(); err != nil {
				return err
			}
			if !broker.seen("AKIASECONDKEYROTATED") {
				return errors.New("no re-authentication with the rotated key yet")
			}
			return nil
		})
	})
}

// TestDatabasePasswordFile: on a PostgreSQL that checks passwords
// (SCRAM), --database-password-file logs the commands in; a pool's new
// sessions read the file as they open, so after the password is changed
// on the server and in the file they log in with the new one without a
// restart; a wrong password stops a command with PostgreSQL's refusal and
// which flags to check, and never prints the password.
func TestDatabasePasswordFile(t *testing.T) {
	ctx := t.Context()
	srv := testenv.StartPostgres(t)
	admin := srv.DB(t).Pool
	if _, err := admin.Exec(ctx, "CREATE ROLE app SUPERUSER LOGIN PASSWORD '"+"first-"+secret+"'"); err != nil {
		t.Fatal(err)
	}
	var hba string
	if err := admin.QueryRow(ctx, "SHOW hba_file").Scan(&hba); err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	// The first matching line decides: app must give its password over
	// TCP, the test's own postgres user still need not.
	if err := os.WriteFile(hba, append([]byte("host all app 127.0.0.1/32 scram-sha-256\n"), rules...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	appURL := fmt.Sprintf("postgres://app@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", srv.Port)
	testenv.WaitFor(t, 30*time.Second, func() error {
		conn, err := pgx.Connect(ctx, appURL)
		if err == nil {
			conn.Close(ctx)
			return errors.New("app still logs in without a password: the server has not reloaded pg_hba.conf")
		}
		return nil
	})
	pwFile := filepath.Join(t.TempDir(), "db-password")
	writeSecret(t, pwFile, "first-"+secret)
	config := writeFile(t, "projections.yaml", string(demo.Projections))

	out, err := runCaptured(ctx, "migrate", "--database-url", appURL, "--database-password-file", pwFile, "--config", config, "--log-format", "text")
	if err != nil {
		t.Fatalf("migrate with --database-password-file: %v\n%s", err, out)
	}
	if out, err := runCaptured(ctx, "dlq", "list", "--database-url", appURL, "--database-password-file", pwFile); err != nil {
		t.Fatalf("dlq list with --database-password-file: %v\n%s", err, out)
	}

	t.Run("rotated", func(t *testing.T) {
		cfg, err := parseDatabaseURL(dbSource{url: appURL, passwordFile: pwFile})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("a session with the file's password: %v", err)
		}
		if _, err := admin.Exec(ctx, "ALTER ROLE app PASSWORD '"+"second-"+secret+"'"); err != nil {
			t.Fatal(err)
		}
		pool.Reset() // the open sessions are closed: the next one opens anew
		if err := pool.Ping(ctx); err == nil {
			t.Fatal("a new session logged in with the old password: the server did not change it, and the test proves nothing")
		}
		writeSecret(t, pwFile, "second-"+secret)
		pool.Reset()
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("after the file was rotated, a new session did not log in with its password: %v", err)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		wrong := filepath.Join(t.TempDir(), "wrong")
		writeSecret(t, wrong, "Wr0ng-"+secret)
		out, err := runCaptured(ctx, "dlq", "list", "--database-url", appURL, "--database-password-file", wrong)
		if err == nil {
			t.Fatalf("dlq list with a wrong password succeeded:\n%s", out)
		}
		for _, want := range []string{`as user "app"`, "28P01", "--database-password-file"} {
			if !strings.Contains(out, want) {
				t.Errorf("dlq list with a wrong password does not say %q:\n%s", want, out)
			}
		}
		noSecret(t, "dlq list", out)
	})
}

// TestRegistrySecretFiles: --registry-bearer-token-file and
// --registry-password-file are read at each request, so a secret rotated
// in its file is sent from the next request on.
func TestRegistrySecretFiles(t *testing.T) {
	ctx := t.Context()
	fake, _ := testenv.Registry(t)
	var mu sync.Mutex
	want := ""
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Authorization") == want {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error_code":401,"message":"Unauthorized"}`)
		return true
	})
	expect := func(header string) {
		mu.Lock()
		want = header
		mu.Unlock()
	}
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	file := filepath.Join(t.TempDir(), "registry-secret")
	for _, tc := range []struct {
		name   string
		auth   registryAuth
		header func(secret string) string
	}{
		{"bearer token", registryAuth{registryTokenFile: file}, func(s string) string { return "Bearer " + s }},
		{"basic auth password", registryAuth{registryUser: "reader", registryPasswordFile: file}, func(s string) string { return basic("reader", s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeSecret(t, file, "first-"+secret)
			expect(tc.header("first-" + secret))
			c := common{registryURL: fake.URL(), registryAuth: tc.auth}
			cl, err := c.registryClient()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.Subjects(ctx); err != nil {
				t.Fatalf("a request with the file's secret: %v", err)
			}
			expect(tc.header("second-" + secret))
			if _, err := cl.Subjects(ctx); err == nil {
				t.Fatal("the registry took the old secret: the test proves nothing")
			}
			writeSecret(t, file, "second-"+secret)
			if _, err := cl.Subjects(ctx); err != nil {
				t.Fatalf("after the file was rotated, the request did not carry its secret: %v", err)
			}
		})
	}
}

// TestRegistryRefusesCredentials: a registry that refuses the token
// stops produce with its answer and which flags to check, never the
// token.
func TestRegistryRefusesCredentials(t *testing.T) {
	fake, _ := testenv.Registry(t)
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error_code":401,"message":"Unauthorized"}`)
		return true
	})
	kafka := testenv.Kafka(t, demo.Topic, 1)
	token := writeFile(t, "token", "Wr0ng-"+secret+"\n")
	_, lines := jsonLines(t, smallStream())
	out, err := runCaptured(t.Context(), "produce", "--brokers", strings.Join(kafka.ListenAddrs(), ","), "--registry-url", fake.URL(),
		"--registry-bearer-token-file", token, "--topic", demo.Topic, "--schema", filepath.Join("..", "..", "internal", "demo", "account_event.avsc"),
		"--key-field", "account_id", "--file", writeFile(t, "events.jsonl", lines), "--timeout", "10s")
	if err == nil {
		t.Fatalf("produce with a refused token succeeded:\n%s", out)
	}
	if !strings.Contains(err.Error(), "Unauthorized (HTTP 401)\nThe Schema Registry refused the credentials: check --registry-user") || strings.Count(err.Error(), "\n") != 1 {
		t.Errorf("produce with a refused token: want the registry's answer and the flags to check, in two lines:\n%s", out)
	}
	noSecret(t, "produce", out)
}

// TestLoginFlagErrors: a secret given twice (as itself and as a file), a
// file missing or empty, a mechanism without what it logs in with: each
// stops the command before it connects, with one line that names the
// flag and its variable, and never the secret.
func TestLoginFlagErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	writeSecret(t, good, secret)
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	status := []string{"status", "--brokers", "127.0.0.1:1", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=1"}
	dlq := []string{"dlq", "list"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(status, "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", "u", "--kafka-sasl-password", secret, "--kafka-sasl-password-file", good),
			"both --kafka-sasl-password (PROJECTOR_KAFKA_SASL_PASSWORD) and --kafka-sasl-password-file (PROJECTOR_KAFKA_SASL_PASSWORD_FILE) are given"},
		{append(status, "--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u", "--kafka-sasl-password-file", missing),
			"--kafka-sasl-password-file " + missing + " (PROJECTOR_KAFKA_SASL_PASSWORD_FILE): no such file or directory"},
		{append(status, "--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-username", "u", "--kafka-sasl-password-file", empty),
			"--kafka-sasl-password-file " + empty + " (PROJECTOR_KAFKA_SASL_PASSWORD_FILE): the file is empty"},
		{append(status, "--kafka-sasl-mechanism", "oauthbearer"),
			"--kafka-sasl-mechanism oauthbearer needs --kafka-sasl-oauth-token-file (PROJECTOR_KAFKA_SASL_OAUTH_TOKEN_FILE)"},
		{append(status, "--kafka-sasl-mechanism", "oauthbearer", "--kafka-sasl-oauth-token-file", empty),
			"--kafka-sasl-oauth-token-file " + empty + " (PROJECTOR_KAFKA_SASL_OAUTH_TOKEN_FILE): the file is empty"},
		{append(status, "--kafka-sasl-mechanism", "oauthbearer", "--kafka-sasl-oauth-token-file", good, "--kafka-sasl-password", secret),
			"--kafka-sasl-mechanism oauthbearer logs in with the token of --kafka-sasl-oauth-token-file alone"},
		{append(status, "--kafka-sasl-mechanism", "plain", "--kafka-sasl-username", "u", "--kafka-sasl-password", secret, "--kafka-sasl-oauth-token-file", good),
			"--kafka-sasl-oauth-token-file and --kafka-sasl-oauth-extensions are for --kafka-sasl-mechanism oauthbearer, not plain"},
		{append(status, "--kafka-sasl-mechanism", "aws-msk-iam", "--kafka-sasl-username", "u"),
			"--kafka-sasl-mechanism aws-msk-iam logs in with the AWS SDK's default credentials"},
		{append(status, "--kafka-sasl-password-file", good),
			"need --kafka-sasl-mechanism (PROJECTOR_KAFKA_SASL_MECHANISM): plain, scram-sha-256, scram-sha-512, oauthbearer or aws-msk-iam"},
		{append(status, "--kafka-sasl-mechanism", "oauthbearer", "--kafka-sasl-oauth-token-file", good, "--kafka-sasl-oauth-extensions", "logicalCluster=lkc-1,pool-id=x"),
			`--kafka-sasl-oauth-extensions: "pool-id=x" is not key=value with a key of letters`},
		{append(dlq, "--database-url", "postgres://app:"+secret+"@127.0.0.1:1/test", "--database-password-file", good),
			"both a password in --database-url (PROJECTOR_DATABASE_URL) and --database-password-file (PROJECTOR_DATABASE_PASSWORD_FILE) are given"},
		{append(dlq, "--database-url", "host=127.0.0.1 port=1 dbname=test user=app password="+secret, "--database-password-file", good),
			"both a password in --database-url"},
		{append(dlq, "--database-url", "postgres://app@127.0.0.1:1/test", "--database-password-file", missing),
			"--database-password-file " + missing + " (PROJECTOR_DATABASE_PASSWORD_FILE): no such file or directory"},
	} {
		out, err := runCaptured(t.Context(), tc.args...)
		if err == nil {
			t.Errorf("projector %s: no error", strings.Join(tc.args, " "))
			continue
		}
		if !strings.Contains(out, tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("projector %s: want one line saying %q, got:\n%s", strings.Join(tc.args, " "), tc.want, out)
		}
		noSecret(t, strings.Join(tc.args, " "), out)
	}

	for _, tc := range []struct {
		auth registryAuth
		url  string
		want string
	}{
		{registryAuth{registryUser: "u", registryPassword: secret, registryPasswordFile: good}, "http://127.0.0.1:1",
			"both --registry-password (PROJECTOR_REGISTRY_PASSWORD) and --registry-password-file (PROJECTOR_REGISTRY_PASSWORD_FILE) are given"},
		{registryAuth{registryPasswordFile: good}, "http://u:" + secret + "@127.0.0.1:1",
			"both a password in --registry-url and --registry-password-file (PROJECTOR_REGISTRY_PASSWORD_FILE) are given"},
		{registryAuth{registryToken: secret, registryTokenFile: good}, "http://127.0.0.1:1",
			"both --registry-bearer-token (PROJECTOR_REGISTRY_BEARER_TOKEN) and --registry-bearer-token-file (PROJECTOR_REGISTRY_BEARER_TOKEN_FILE) are given"},
		{registryAuth{registryTokenFile: empty}, "http://127.0.0.1:1",
			"--registry-bearer-token-file " + empty + " (PROJECTOR_REGISTRY_BEARER_TOKEN_FILE): the file is empty"},
		{registryAuth{registryUser: "u", registryTokenFile: good}, "http://127.0.0.1:1",
			"--registry-bearer-token(-file) and basic auth (--registry-user"},
		{registryAuth{registryPasswordFile: good}, "http://127.0.0.1:1",
			"--registry-password-file (PROJECTOR_REGISTRY_PASSWORD_FILE) needs --registry-user (PROJECTOR_REGISTRY_USER)"},
	} {
		c := common{registryURL: tc.url, registryAuth: tc.auth}
		_, err := c.registryClient()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), secret) {
			t.Errorf("registry client of %+v: %v, want an error saying %q", tc.auth, err, tc.want)
		}
	}
}

// TestConfigPrintSecretFlags: config print shows the paths of the secret
// files, which a review checks, and hides the registry's bearer token.
func TestConfigPrintSecretFlags(t *testing.T) {
	t.Setenv("PROJECTOR_REGISTRY_BEARER_TOKEN", secret)
	out, err := runCaptured(t.Context(), "config", "print", "run", "--kafka-sasl-mechanism", "oauthbearer",
		"--kafka-sasl-oauth-token-file", "/var/run/secrets/kafka/token", "--kafka-sasl-password-file", "/var/run/secrets/kafka/password",
		"--registry-password-file", "/var/run/secrets/registry/password", "--database-password-file", "/var/run/secrets/db/password")
	if err != nil {
		t.Fatalf("config print: %v\n%s", err, out)
	}
	for _, want := range []string{
		"--kafka-sasl-oauth-token-file=/var/run/secrets/kafka/token",
		"--kafka-sasl-password-file=/var/run/secrets/kafka/password",
		"--registry-password-file=/var/run/secrets/registry/password",
		"--database-password-file=/var/run/secrets/db/password",
		"--registry-bearer-token=(set, hidden)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("config print does not show %s:\n%s", want, out)
		}
	}
	noSecret(t, "config print", out)
}
