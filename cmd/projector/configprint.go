package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/internal/redact"
)

// configCommand groups the configuration commands.
func configCommand(stdout, stderr io.Writer) *ffcli.Command {
	return &ffcli.Command{
		Name:        "config",
		ShortUsage:  "projector config <print> [flags]",
		ShortHelp:   "Show the configuration a command would run with.",
		FlagSet:     flag.NewFlagSet("projector config", flag.ContinueOnError),
		Subcommands: []*ffcli.Command{configPrintCommand(stdout, stderr)},
		Exec:        func(context.Context, []string) error { return flag.ErrHelp },
	}
}

// setting is one flag of the effective configuration.
type setting struct {
	Flag   string `json:"flag"`
	Value  string `json:"value"`
	Source string `json:"source"` // "command line", "environment" or "default"
	Env    string `json:"env,omitempty"`
}

func configPrintCommand(stdout, stderr io.Writer) *ffcli.Command {
	var asJSON bool
	return newCommand("print", "projector config print [--json] [COMMAND [FLAGS]]",
		"Print the configuration COMMAND (default run) would run with: every flag's value and where it came from (its command line, its environment variable, or the default), secrets hidden. "+
			"The projection file's content is not printed, only its path: this is what a deployment's review reads.", stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, "print a JSON array of {flag, value, source, env}")
		},
		func(_ context.Context, args []string) error {
			settings, path, err := effectiveConfig(stderr, args)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(settings)
			}
			fmt.Fprintf(stdout, "# %s: the configuration it would run with (command line, then environment, then defaults; secrets hidden)\n", path)
			tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
			for _, s := range settings {
				from := s.Source
				if s.Source == "environment" {
					from = s.Env
				}
				fmt.Fprintf(tw, "--%s=%s\t# %s\n", s.Flag, s.Value, from)
			}
			return tw.Flush()
		})
}

// effectiveConfig parses args (a command's path and its flags) and the
// environment as that command would, without running it.
func effectiveConfig(stderr io.Writer, args []string) ([]setting, string, error) {
	root := rootCommand(io.Discard, io.Discard)
	c := &cli{stdout: io.Discard, stderr: stderr, paths: map[*ffcli.Command]string{}, knownEnv: map[string]bool{}}
	c.apply(root, root.Name)
	cmd, path := root, root.Name
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		var next *ffcli.Command
		for _, sub := range cmd.Subcommands {
			if sub.Name == args[0] {
				next = sub
			}
		}
		if next == nil {
			return nil, "", unknownCommand(cmd, path, args[0])
		}
		cmd, path, args = next, path+" "+next.Name, args[1:]
	}
	if cmd == root {
		cmd, path = findCommand(root, "run"), "projector run"
	}
	if len(cmd.Subcommands) > 0 {
		return nil, "", &usageError{msg: fmt.Sprintf("%s groups commands: name one of them", path)}
	}
	fs := cmd.FlagSet
	if err := fs.Parse(args); err != nil {
		if c.badValue != nil {
			return nil, "", c.badValue
		}
		return nil, "", &usageError{msg: fmt.Sprintf("%v; see %s --help", err, path)}
	}
	if fs.NArg() > 0 {
		return nil, "", &usageError{msg: fmt.Sprintf("unexpected argument %q; see %s --help", fs.Arg(0), path)}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := c.readEnv(path, fs); err != nil {
		return nil, "", err
	}
	fromEnv := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { fromEnv[f.Name] = !given[f.Name] })
	var out []setting
	fs.VisitAll(func(f *flag.Flag) {
		s := setting{Flag: f.Name, Value: shown(f), Source: "default"}
		switch {
		case given[f.Name]:
			s.Source = "command line"
		case fromEnv[f.Name]:
			s.Source, s.Env = "environment", envVar(path, f.Name)
		}
		out = append(out, s)
	})
	return out, path, nil
}

// shown is a flag's value as config print shows it: a secret's only as
// set or not, any other with the passwords in it masked.
func shown(f *flag.Flag) string {
	v := f.Value.String()
	name := strings.ToLower(f.Name)
	for _, w := range []string{"password", "secret", "token"} {
		if strings.Contains(name, w) && !strings.HasSuffix(name, "-file") {
			if v == "" {
				return ""
			}
			return "(set, hidden)"
		}
	}
	return redact.String(v)
}

func findCommand(root *ffcli.Command, name string) *ffcli.Command {
	for _, sub := range root.Subcommands {
		if sub.Name == name {
			return sub
		}
	}
	return nil
}
