// Package kafkaclient is the one place the options of projector's Kafka
// clients are built (the engine's consumer, the relay's and the dead-letter
// replay's producers, the admin commands' clients), so that what every
// client needs to reach a cluster, such as TLS or SASL, is added once.
package kafkaclient

import (
	"crypto/tls"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/plugin/kprom"
)

// Config is what every client of one process shares.
type Config struct {
	// Brokers are the seed brokers.
	Brokers []string
	// Registerer, when set, receives the client's metrics (namespace kgo).
	Registerer prometheus.Registerer
	// Logger, when set, receives the client's warnings and errors (an
	// unreachable broker, a failed request), each distinct message at most
	// once a minute.
	Logger *slog.Logger
	// TLS, when set, makes every connection to a broker TLS with this
	// configuration (Kafka's security.protocol SSL or SASL_SSL); nil is
	// plaintext.
	TLS *tls.Config
	// SASL, when set, authenticates every connection with this mechanism
	// (Kafka's sasl.mechanism); nil is no authentication.
	SASL sasl.Mechanism
	// Extra are further options (timeouts and the like), applied last so
	// that they override the ones a role sets.
	Extra []kgo.Opt
}

// Options returns the options of a client with role's options: c's
// brokers, transport and metrics, then role, then c.Extra.
func Options(c Config, role ...kgo.Opt) []kgo.Opt {
	opts := append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, TransportOptions(c)...)
	if c.Registerer != nil {
		opts = append(opts, kgo.WithHooks(kprom.NewMetrics("kgo", kprom.Registerer(c.Registerer))))
	}
	if c.Logger != nil {
		opts = append(opts, kgo.WithLogger(newLogger(c.Logger, nil)))
	}
	opts = append(opts, role...)
	return append(opts, c.Extra...)
}

// TransportOptions are the options of c's TLS and SASL alone, for a
// client whose other options are built elsewhere.
func TransportOptions(c Config) []kgo.Opt {
	var opts []kgo.Opt
	if c.TLS != nil {
		// The client clones it on every dial and fills in the broker's
		// host as the server name when the config has none.
		opts = append(opts, kgo.DialTLSConfig(c.TLS))
	}
	if c.SASL != nil {
		opts = append(opts, kgo.SASL(c.SASL))
	}
	return opts
}

// ConsumerOptions is Options for a consumer, which reads only committed
// records: an aborted transaction's records must never reach a table.
func ConsumerOptions(c Config, role ...kgo.Opt) []kgo.Opt {
	return Options(c, append([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, role...)...)
}

// New returns a client with Options(c, role...). Like kgo.NewClient it
// does not wait for a broker, but it starts the client's goroutines: the
// caller closes it.
func New(c Config, role ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(Options(c, role...)...)
}
