// Command projector-bench measures projector against Postgres's COPY limit
// and against the consumers users write by hand, on one generated stream,
// and checks every result against a reference fold of that stream.
//
// It is a command of its own so that the production binary does not link
// the peers it is measured against (Sarama, Watermill) or the embedded
// broker and registry it runs them on.
//
// Every flag can also be set through an environment variable, which
// --help names: PROJECTOR_BENCH_ followed by the flag name in upper case
// with dashes as underscores (--events → PROJECTOR_BENCH_EVENTS), so that
// a shell set up for projector does not change the benchmark, nor the
// benchmark's settings projector; --database-url reads projector's own
// PROJECTOR_DATABASE_URL. A flag on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/projector-dev/projector/internal/redact"
)

// DefaultDatabaseURL is used when neither --database-url nor
// PROJECTOR_DATABASE_URL is set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "projector-bench:", err)
		}
		os.Exit(1)
	}
}

// Main runs the benchmark with the command line args, writing the report
// to stdout and progress to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := &benchFlags{}
	fs := flag.NewFlagSet("projector-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	fs.VisitAll(func(fl *flag.Flag) {
		if v := envVar(fl.Name); v != "" {
			fl.Usage += " (" + v + ")"
		}
	})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: projector-bench [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, benchHelp)
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := readEnv(fs); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: projector-bench takes flags only (--help lists them)", fs.Args())
	}
	// Whatever failed, its message is masked: errors quote URLs and
	// connection strings.
	return redact.Error(f.exec(ctx, stdout, stderr))
}

// envVar is the environment variable of the flag name, or "" for none.
func envVar(name string) string {
	switch name {
	case "database-url":
		return "PROJECTOR_DATABASE_URL" // the database projector uses too
	case "worker":
		return "" // set by the benchmark for its children, on their command line
	}
	return "PROJECTOR_BENCH_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// readEnv sets every flag of fs that the command line did not give from
// its environment variable.
func readEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := envVar(f.Name)
		v := os.Getenv(name)
		if err != nil || given[f.Name] || name == "" || v == "" {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("invalid value %q for --%s from %s: %w", v, f.Name, name, serr)
		}
	})
	return err
}
