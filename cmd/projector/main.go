// Command projector turns Kafka event streams into versioned read models in
// PostgreSQL. Subcommands: run, serve, dev, produce, check, relay, demo, migrate,
// status, offsets, dlq, tombstones, rebuild, auth, asyncapi, version, config.
// The benchmark is the command projector-bench.
//
// Most flags can also be set through an environment variable, which
// --help names: PROJECTOR_ followed by the flag name in upper case with
// dashes as underscores (--database-url → PROJECTOR_DATABASE_URL), or with
// the command's name before it where the same flag name means something
// else elsewhere (relay's --unready-after → PROJECTOR_RELAY_UNREADY_AFTER).
// A flag on the command line wins. The flags that confirm a destructive
// action (--execute, --dry-run, --yes, dev's --take-over-identity) are
// taken from the command line only.
//
// Exit status: 0 on success and for --help; 1 when a command ran and
// failed (for check: it found problems); 2 when the command line is wrong
// and nothing ran; 3 when check could not ask PostgreSQL or the registry,
// and so proved nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/internal/stopsignal"
)

// DefaultDatabaseURL is used when neither --database-url nor
// PROJECTOR_DATABASE_URL is set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func main() {
	ctx, stop := stopsignal.Context(context.Background())
	defer stop()
	if err := Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !silent(err) {
			fmt.Fprintln(os.Stderr, "projector:", err)
		}
		os.Exit(exitCode(err))
	}
}

// Main runs the command line args, writing results to stdout and logs and
// progress to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if benchMoved(args) {
		return errBenchMoved
	}
	// Whatever failed, its message is masked: errors quote URLs and
	// connection strings.
	return redact.Error(loginHint(execute(ctx, rootCommand(stdout, stderr), args, stdout, stderr)))
}

// rootCommand builds the command tree; docs/configuration.md is generated
// from its flag sets, so that the reference cannot drift from the flags.
func rootCommand(stdout, stderr io.Writer) *ffcli.Command {
	root := &ffcli.Command{
		Name:       "projector",
		ShortUsage: "projector <subcommand> [flags]",
		ShortHelp:  "Kafka event streams into versioned read models in PostgreSQL.",
		Subcommands: []*ffcli.Command{
			runCommand(stdout, stderr),
			devCommand(stdout, stderr),
			demoCommand(stdout, stderr),
			produceCommand(os.Stdin, stdout, stderr),
			checkCommand(stdout, stderr),
			migrateCommand(stdout, stderr),
			statusCommand(stdout, stderr),
			offsetsCommand(stdout, stderr),
			dlqCommand(stdout, stderr),
			tombstonesCommand(stdout, stderr),
			rebuildCommand(stdout, stderr),
			relayCommand(stdout, stderr),
			serveCommand(stdout, stderr),
			versionCommand(stdout, stderr),
			configCommand(stdout, stderr),
			asyncapiCommand(stdout, stderr),
			authCommand(os.Stdin, stdout, stderr),
			benchMovedCommand(),
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
	root.FlagSet = flag.NewFlagSet("projector", flag.ContinueOnError)
	root.FlagSet.SetOutput(stderr)
	return root
}

// common are the flags most subcommands share.
type common struct {
	brokers     string
	registryURL string
	registryAuth
	kafkaTransport
	databaseURL string
	identity    string
	config      string
	logLevel    string
	logFormat   string

	// databasePasswordFile is read as each session opens.
	databasePasswordFile string
}

func (c *common) register(fs *flag.FlagSet, which ...string) {
	for _, w := range which {
		switch w {
		case "brokers":
			fs.StringVar(&c.brokers, "brokers", "", "Kafka seed brokers, comma-separated")
			c.kafkaTransport.register(fs)
		case "registry-url":
			fs.StringVar(&c.registryURL, "registry-url", "", "Schema Registry URL")
			c.registryAuth.register(fs)
			c.kafkaTransport.registerRegistry(fs)
		case "database-url":
			fs.StringVar(&c.databaseURL, "database-url", DefaultDatabaseURL, "PostgreSQL connection URL")
			fs.StringVar(&c.databasePasswordFile, "database-password-file", "", "file holding the PostgreSQL password (a mounted Kubernetes secret, say), for a --database-url without one; read as each session opens, so a rotated password reaches the new sessions")
		case "identity":
			fs.StringVar(&c.identity, "identity", "projector", "consumer identity: the Kafka group id and the namespace of stored offsets")
		case "config":
			fs.StringVar(&c.config, "config", "projections.yaml", "projection file")
		case "log":
			fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
			fs.StringVar(&c.logFormat, "log-format", "json", "log format: json or text")
		}
	}
}

func (c *common) brokerList() ([]string, error) {
	var out []string
	for _, b := range strings.Split(c.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("--brokers (PROJECTOR_BROKERS) is required: the Kafka seed brokers, comma-separated")
	}
	return out, nil
}

func (c *common) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.logLevel)
	}
	// Every string and error logged is masked, whoever logs it: a
	// client's error may quote a URL with credentials.
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: redact.ReplaceAttr}
	switch c.logFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", c.logFormat)
}

// newCommand builds a subcommand; execute has its flags read their
// environment variables.
func newCommand(name, usage, help string, stderr io.Writer, setup func(fs *flag.FlagSet), exec func(ctx context.Context, args []string) error) *ffcli.Command {
	fs := flag.NewFlagSet("projector "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	setup(fs)
	return &ffcli.Command{
		Name:       name,
		ShortUsage: usage,
		ShortHelp:  help,
		FlagSet:    fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := checkURLFlags(fs); err != nil {
				return err
			}
			return exec(ctx, args)
		},
	}
}
