package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/kafkaclient"
)

// kafkaTransport are the flags of how a command reaches a secured Kafka
// cluster: every command given --brokers has them, so that one cluster's
// settings work with all of them.
type kafkaTransport struct {
	tls            bool
	caFile         string
	certFile       string
	keyFile        string
	serverName     string
	saslMechanism  string
	saslUsername   string
	saslPassword   string
	registryCAFile string

	// saslPasswordFile and saslTokenFile name files read at each login.
	saslPasswordFile string
	saslTokenFile    string
	saslExtensions   string
	// mech is the mechanism once built: built again, an aws-msk-iam one
	// would look up the AWS credentials twice.
	mech sasl.Mechanism
	// warnTo is the command's stderr, for the warnings of the flags'
	// combination when the command has no logger; warned: said once.
	warnTo io.Writer
	warned bool
}

func (k *kafkaTransport) register(fs *flag.FlagSet) {
	// newCommand gives the flag set the command's stderr before the
	// flags are registered (the command line's conventions silence it
	// only later, for parse errors).
	k.warnTo = fs.Output()
	fs.BoolVar(&k.tls, "kafka-tls", false, "connect to the brokers over TLS, verified against the system's CAs unless --kafka-tls-ca-file; implied by any other --kafka-tls-* flag")
	fs.StringVar(&k.caFile, "kafka-tls-ca-file", "", "PEM file of the CAs that sign the brokers' certificates, instead of the system's")
	fs.StringVar(&k.certFile, "kafka-tls-cert-file", "", "PEM file of the client certificate, for brokers that require one; needs --kafka-tls-key-file")
	fs.StringVar(&k.keyFile, "kafka-tls-key-file", "", "PEM file of the client certificate's private key; needs --kafka-tls-cert-file")
	fs.StringVar(&k.serverName, "kafka-tls-server-name", "", "name the brokers' certificates are verified against; empty: each broker's host")
	fs.StringVar(&k.saslMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: plain, scram-sha-256, scram-sha-512 (with --kafka-sasl-username and a password), oauthbearer (with --kafka-sasl-oauth-token-file) or aws-msk-iam (Amazon MSK's IAM access control, with the AWS SDK's default credentials); empty: no SASL")
	fs.StringVar(&k.saslUsername, "kafka-sasl-username", "", "SASL user name")
	fs.StringVar(&k.saslPassword, "kafka-sasl-password", "", "SASL password; prefer the environment variable, a flag shows in ps, or --kafka-sasl-password-file")
	fs.StringVar(&k.saslPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (a mounted Kubernetes secret, say), instead of --kafka-sasl-password; read at each login, so a rotated password is used by the next connection")
	fs.StringVar(&k.saslExtensions, "kafka-sasl-oauth-extensions", "", "SASL extensions sent with the OAUTHBEARER token, key=value pairs separated by commas; Confluent Cloud wants logicalCluster=lkc-…,identityPoolId=pool-…")
	fs.StringVar(&k.saslTokenFile, "kafka-sasl-oauth-token-file", "", "file holding the OAUTHBEARER token, for --kafka-sasl-mechanism oauthbearer; read at each login and re-authentication, so a token renewed in place is used from then on")
}

func (k *kafkaTransport) registerRegistry(fs *flag.FlagSet) {
	fs.StringVar(&k.registryCAFile, "registry-tls-ca-file", "", "PEM file of the CAs that sign an https:// --registry-url's certificate, instead of the system's")
}

// kafkaConfig returns the client configuration of --brokers and the
// transport flags, with log and metrics; it reads the files the flags
// name, so that a wrong flag stops the command before anything connects.
func (c *common) kafkaConfig(log *slog.Logger, metrics prometheus.Registerer) (kafkaclient.Config, error) {
	brokers, err := c.brokerList()
	if err != nil {
		return kafkaclient.Config{}, err
	}
	tlsCfg, err := c.kafkaTLS()
	if err != nil {
		return kafkaclient.Config{}, err
	}
	mech, err := c.kafkaSASL()
	if err != nil {
		return kafkaclient.Config{}, err
	}
	c.warnCleartext(log, tlsCfg, mech)
	return kafkaclient.Config{Brokers: brokers, TLS: tlsCfg, SASL: mech, Logger: log, Registerer: metrics}, nil
}

// checkTransport reports what is wrong with the transport flags, for a
// command that builds its client only later.
func (k *kafkaTransport) checkTransport() error {
	tlsCfg, err := k.kafkaTLS()
	if err != nil {
		return err
	}
	mech, err := k.kafkaSASL()
	if err != nil {
		return err
	}
	k.warnCleartext(nil, tlsCfg, mech)
	return nil
}

// warnCleartext warns, once per command, when SASL is to run over a
// connection without TLS: PLAIN then sends the password as it is, and
// with SCRAM, which does not, the records and the authenticated session
// still cross the network in clear. It is a warning, not a refusal: a
// cluster on a private network may be set up so on purpose. log, when not
// nil, says it; otherwise it is a line on the command's stderr. Neither
// names the user or the password.
func (k *kafkaTransport) warnCleartext(log *slog.Logger, tlsCfg *tls.Config, mech sasl.Mechanism) {
	if mech == nil || tlsCfg != nil || k.warned {
		return
	}
	k.warned = true
	what := "the records and the authenticated session cross the network unencrypted"
	switch mech.Name() {
	case "PLAIN":
		what = "the password crosses the network as it is, and the records unencrypted"
	case "OAUTHBEARER":
		what = "the token crosses the network as it is, and the records unencrypted"
	}
	msg := fmt.Sprintf("SASL %s without TLS: %s; --kafka-tls (PROJECTOR_KAFKA_TLS) connects over TLS", mech.Name(), what)
	if log != nil {
		log.Warn(msg)
		return
	}
	w := k.warnTo
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintln(w, "projector: warning:", msg)
}

// kafkaTLS is the TLS configuration of the --kafka-tls* flags, nil for
// plaintext.
func (k *kafkaTransport) kafkaTLS() (*tls.Config, error) {
	if k.certFile != "" && k.keyFile == "" {
		return nil, errors.New("--kafka-tls-cert-file needs --kafka-tls-key-file (PROJECTOR_KAFKA_TLS_KEY_FILE): the client certificate's private key")
	}
	if k.keyFile != "" && k.certFile == "" {
		return nil, errors.New("--kafka-tls-key-file needs --kafka-tls-cert-file (PROJECTOR_KAFKA_TLS_CERT_FILE): the client certificate")
	}
	if !k.tls && k.caFile == "" && k.certFile == "" && k.serverName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.serverName}
	if k.caFile != "" {
		pool, err := certPool("--kafka-tls-ca-file", k.caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if k.certFile != "" {
		cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
		if err != nil {
			// The error names the files; it never quotes the key.
			return nil, fmt.Errorf("--kafka-tls-cert-file %s, --kafka-tls-key-file %s: %w", k.certFile, k.keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// certPool reads the PEM certificates of file, given by flag.
func certPool(flag, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in the file", flag, file)
	}
	return pool, nil
}

// saslMechanisms are the values of --kafka-sasl-mechanism, for errors.
const saslMechanisms = "plain, scram-sha-256, scram-sha-512, oauthbearer or aws-msk-iam"

// kafkaSASL is the mechanism of the --kafka-sasl-* flags, nil for none.
// The secrets it needs are looked up now, so that a missing one stops the
// command before anything connects, and again at each login.
func (k *kafkaTransport) kafkaSASL() (sasl.Mechanism, error) {
	if k.mech != nil {
		return k.mech, nil
	}
	mech, err := k.buildSASL()
	if err != nil {
		return nil, err
	}
	k.mech = mech
	return mech, nil
}

func (k *kafkaTransport) buildSASL() (sasl.Mechanism, error) {
	mech := strings.ToLower(strings.TrimSpace(k.saslMechanism))
	if mech == "" {
		if k.saslUsername != "" || k.saslPassword != "" || k.saslPasswordFile != "" || k.saslTokenFile != "" || k.saslExtensions != "" {
			return nil, errors.New("--kafka-sasl-username, --kafka-sasl-password(-file) and --kafka-sasl-oauth-token-file or -extensions need --kafka-sasl-mechanism (PROJECTOR_KAFKA_SASL_MECHANISM): " + saslMechanisms)
		}
		return nil, nil
	}
	switch mech {
	case "plain", "scram-sha-256", "scram-sha-512":
		return k.passwordSASL(mech)
	case "oauthbearer":
		if k.saslUsername != "" || k.saslPassword != "" || k.saslPasswordFile != "" {
			return nil, errors.New("--kafka-sasl-mechanism oauthbearer logs in with the token of --kafka-sasl-oauth-token-file alone: leave out --kafka-sasl-username, --kafka-sasl-password and --kafka-sasl-password-file")
		}
		if k.saslTokenFile == "" {
			return nil, errors.New("--kafka-sasl-mechanism oauthbearer needs --kafka-sasl-oauth-token-file (PROJECTOR_KAFKA_SASL_OAUTH_TOKEN_FILE): the file the token is written to and renewed in")
		}
		token, err := oneSecret("--kafka-sasl-oauth-token", "", "--kafka-sasl-oauth-token-file", k.saslTokenFile)
		if err != nil {
			return nil, err
		}
		ext, err := oauthExtensions(k.saslExtensions)
		if err != nil {
			return nil, err
		}
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			t, err := token.read()
			return oauth.Auth{Token: t, Extensions: ext}, err
		}), nil
	case "aws-msk-iam":
		if k.saslExtensions != "" {
			return nil, errors.New("--kafka-sasl-oauth-extensions is for --kafka-sasl-mechanism oauthbearer, not aws-msk-iam")
		}
		if k.saslUsername != "" || k.saslPassword != "" || k.saslPasswordFile != "" || k.saslTokenFile != "" {
			return nil, errors.New("--kafka-sasl-mechanism aws-msk-iam logs in with the AWS SDK's default credentials (environment, shared files, web identity, container or instance role): leave out --kafka-sasl-username, --kafka-sasl-password, --kafka-sasl-password-file and --kafka-sasl-oauth-token-file")
		}
		return newMSKIAM()
	default:
		return nil, fmt.Errorf("--kafka-sasl-mechanism %q: want %s", k.saslMechanism, saslMechanisms)
	}
}

// oauthExtension is what RFC 7628 allows of a SASL extension: a key of
// letters, a value of printable characters and spaces.
var (
	oauthExtKey   = regexp.MustCompile(`^[A-Za-z]+$`)
	oauthExtValue = regexp.MustCompile(`^[\x21-\x7E \t\r\n]+$`)
)

// oauthExtensions parses --kafka-sasl-oauth-extensions, nil when empty.
func oauthExtensions(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		switch {
		case !ok || !oauthExtKey.MatchString(k) || !oauthExtValue.MatchString(v):
			return nil, fmt.Errorf("--kafka-sasl-oauth-extensions: %q is not key=value with a key of letters and a printable value", kv)
		case k == "auth":
			return nil, errors.New("--kafka-sasl-oauth-extensions: auth is the token's own key")
		}
		out[k] = v
	}
	return out, nil
}

// passwordSASL is the mechanism of a user name and a password, given or
// read from --kafka-sasl-password-file at each login.
func (k *kafkaTransport) passwordSASL(mech string) (sasl.Mechanism, error) {
	if k.saslTokenFile != "" || k.saslExtensions != "" {
		return nil, fmt.Errorf("--kafka-sasl-oauth-token-file and --kafka-sasl-oauth-extensions are for --kafka-sasl-mechanism oauthbearer, not %s", mech)
	}
	if k.saslUsername == "" {
		return nil, fmt.Errorf("--kafka-sasl-mechanism %s needs --kafka-sasl-username (PROJECTOR_KAFKA_SASL_USERNAME)", mech)
	}
	file, err := oneSecret("--kafka-sasl-password", k.saslPassword, "--kafka-sasl-password-file", k.saslPasswordFile)
	if err != nil {
		return nil, err
	}
	if file == nil && k.saslPassword == "" {
		return nil, fmt.Errorf("--kafka-sasl-mechanism %s needs --kafka-sasl-password (PROJECTOR_KAFKA_SASL_PASSWORD) or --kafka-sasl-password-file (PROJECTOR_KAFKA_SASL_PASSWORD_FILE)", mech)
	}
	user, given := k.saslUsername, k.saslPassword
	password := func() (string, error) {
		if file == nil {
			return given, nil
		}
		return file.read()
	}
	switch mech {
	case "plain":
		return plain.Plain(func(context.Context) (plain.Auth, error) {
			p, err := password()
			return plain.Auth{User: user, Pass: p}, err
		}), nil
	case "scram-sha-256":
		return scram.Sha256(func(context.Context) (scram.Auth, error) {
			p, err := password()
			return scram.Auth{User: user, Pass: p}, err
		}), nil
	default:
		return scram.Sha512(func(context.Context) (scram.Auth, error) {
			p, err := password()
			return scram.Auth{User: user, Pass: p}, err
		}), nil
	}
}

// loginHint adds to err which flags to check when a broker refused the
// SASL credentials or the registry the credentials it was sent: the
// clients' own messages name only the Kafka error or the HTTP status.
func loginHint(err error) error {
	if errors.Is(err, kerr.SaslAuthenticationFailed) {
		return fmt.Errorf("%w\nThe brokers refused the SASL credentials: check --kafka-sasl-mechanism, --kafka-sasl-username and --kafka-sasl-password or its -file; "+
			"for oauthbearer the token of --kafka-sasl-oauth-token-file; for aws-msk-iam the AWS credentials found and their kafka-cluster:Connect permission", err)
	}
	var re *sr.ResponseError
	if errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden) {
		return fmt.Errorf("%w (HTTP %d)\nThe Schema Registry refused the credentials: check --registry-user with --registry-password or its -file, or --registry-bearer-token or its -file", err, re.StatusCode)
	}
	return err
}

// registryHTTPClient is the HTTP client of --registry-tls-ca-file, nil
// for the default one.
func (k *kafkaTransport) registryHTTPClient() (*http.Client, error) {
	if k.registryCAFile == "" {
		return nil, nil
	}
	pool, err := certPool("--registry-tls-ca-file", k.registryCAFile)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	// The registry client's own default timeout, kept.
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}, nil
}
