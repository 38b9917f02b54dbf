package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"
)

// The command line's conventions, applied to the whole command tree so
// that every command, whenever it was added, behaves the same:
//
//   - --help, -h and `projector help [command]` print the usage to stdout
//     and exit 0;
//   - a command that only groups others (projector, dlq, offsets), run
//     alone, prints its usage to stderr and exits 2, as the go tool does:
//     nothing was asked, so a script that ran it is wrong;
//   - an unknown subcommand, a bad flag value, an unknown flag or a stray
//     argument is one line on stderr and exit 2, without the whole usage;
//   - a duration must be positive unless zeroDurations says otherwise;
//   - a flag not on the command line is read from its environment
//     variable, which its usage names, as env.go describes.

// takesArgs lists the commands that read positional arguments; every
// other command refuses them, so that a typo is not silently ignored.
var takesArgs = map[string]bool{
	"projector dlq show":       true,
	"projector rebuild status": true,
	"projector rebuild cancel": true,
	"projector help":           true,
	"projector config print":   true,
}

// zeroDurations lists the duration flags whose zero or negative value has
// a meaning, told in their help: 0 leaves PostgreSQL's setting in place,
// a negative --retention keeps published rows (its 0 would silently be
// the default), --progress-every 0 logs no progress, --kafka-commit-interval
// 0 commits nothing to the group, status --sample 0 estimates no drain
// time. Every other duration flag must be positive.
var zeroDurations = map[string]struct{ zero, negative bool }{
	"database-lock-timeout":                {zero: true},
	"database-idle-in-transaction-timeout": {zero: true},
	"retention":                            {negative: true},
	"progress-every":                       {zero: true},
	"kafka-commit-interval":                {zero: true},
	"sample":                               {zero: true},
}

// Exit statuses.
const (
	exitFailed = 1 // the command ran and failed
	exitUsage  = 2 // the command line is wrong; nothing ran
	// check could not ask PostgreSQL or the registry, so proved nothing:
	// neither a pass nor problems found in the file.
	exitNotChecked = 3
)

// usageError is a command line that is wrong in its form. Its message is
// one line; shown is set when the usage was printed instead.
type usageError struct {
	msg   string
	shown bool
}

func (e *usageError) Error() string { return e.msg }

// exitCode is the exit status of a command that returned err.
func exitCode(err error) int {
	var u *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return exitUsage
	case errors.Is(err, errNotChecked):
		return exitNotChecked
	}
	return exitFailed
}

// silent reports whether err needs no message: the usage said it all.
func silent(err error) bool {
	var u *usageError
	return errors.As(err, &u) && u.shown
}

// cli holds what one run of the command line learns while it parses: the
// command whose usage the flag package asked for (on --help or a parse
// failure) and the first flag value that was refused.
type cli struct {
	stdout, stderr io.Writer
	paths          map[*ffcli.Command]string // "projector dlq list"
	usageOf        *ffcli.Command
	badValue       error
	knownEnv       map[string]bool // the variables some command reads
}

// execute runs args on the tree of root under the conventions above.
func execute(ctx context.Context, root *ffcli.Command, args []string, stdout, stderr io.Writer) error {
	c := &cli{stdout: stdout, stderr: stderr, paths: map[*ffcli.Command]string{}, knownEnv: map[string]bool{}}
	root.Subcommands = append(root.Subcommands, c.helpCommand(root))
	c.apply(root, root.Name)
	err := root.ParseAndRun(ctx, args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp) && c.usageOf != nil:
		fmt.Fprint(stdout, ffcli.DefaultUsageFunc(c.usageOf))
		return nil
	case c.badValue != nil:
		return c.badValue
	case c.usageOf != nil:
		// The flag package's own sentence (flag provided but not
		// defined, flag needs an argument), without the usage it
		// would print after it.
		return &usageError{msg: fmt.Sprintf("%v; see %s --help", innermost(err), c.paths[c.usageOf])}
	}
	return err
}

// innermost is the error err wraps at the end of its chain.
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// apply sets the conventions on cmd and the commands under it.
func (c *cli) apply(cmd *ffcli.Command, path string) {
	c.paths[cmd] = path
	if cmd.FlagSet == nil {
		cmd.FlagSet = flag.NewFlagSet(path, flag.ContinueOnError)
	}
	// The flag package prints its error and the whole usage; execute
	// says what went wrong in one line instead.
	cmd.FlagSet.SetOutput(io.Discard)
	cmd.UsageFunc = func(cmd *ffcli.Command) string {
		c.usageOf = cmd
		return ""
	}
	flags := 0
	cmd.FlagSet.VisitAll(func(f *flag.Flag) {
		f.Value = &checked{Value: f.Value, name: f.Name, cli: c}
		f.Usage += " (" + envNote(path, f.Name) + ")"
		if v := envVar(path, f.Name); v != "" {
			c.knownEnv[v] = true
		}
		flags++
	})
	// The environment is read by the commands themselves, below, so
	// that every flag's variable is the one envVar names.
	cmd.Options = nil
	switch {
	case len(cmd.Subcommands) > 0:
		cmd.Exec = c.group(cmd, path)
	case cmd.Exec != nil:
		exec := cmd.Exec
		fs := cmd.FlagSet
		cmd.Exec = func(ctx context.Context, args []string) error {
			if len(args) > 0 && !takesArgs[path] {
				return &usageError{msg: fmt.Sprintf("unexpected argument %q; see %s --help", args[0], path)}
			}
			if flags > 0 {
				if err := c.readEnv(path, fs); err != nil {
					return err
				}
			}
			return exec(ctx, args)
		}
	}
	for _, sub := range cmd.Subcommands {
		c.apply(sub, path+" "+sub.Name)
	}
}

// group is the Exec of a command that only groups subcommands: ffcli runs
// it when no subcommand matched.
func (c *cli) group(cmd *ffcli.Command, path string) func(context.Context, []string) error {
	return func(_ context.Context, args []string) error {
		if len(args) == 0 {
			fmt.Fprint(c.stderr, ffcli.DefaultUsageFunc(cmd))
			return &usageError{msg: path + ": no command given", shown: true}
		}
		if args[0] == "help" { // projector dlq help [list]
			return c.help(cmd, path, args[1:])
		}
		return unknownCommand(cmd, path, args[0])
	}
}

// help prints the usage of the command names lead to from cmd.
func (c *cli) help(cmd *ffcli.Command, path string, names []string) error {
	for _, name := range names {
		var next *ffcli.Command
		for _, sub := range cmd.Subcommands {
			if strings.EqualFold(sub.Name, name) {
				next = sub
			}
		}
		if next == nil {
			return unknownCommand(cmd, path, name)
		}
		cmd, path = next, path+" "+next.Name
	}
	fmt.Fprint(c.stdout, ffcli.DefaultUsageFunc(cmd))
	return nil
}

// unknownCommand says that name is not a subcommand of cmd, and which one
// was probably meant.
func unknownCommand(cmd *ffcli.Command, path, name string) error {
	prefix := strings.TrimPrefix(strings.TrimPrefix(path, "projector"), " ")
	if prefix != "" {
		prefix += " "
	}
	best, bestDist := "", -1
	for _, sub := range cmd.Subcommands {
		if d := editDistance(strings.ToLower(name), sub.Name); bestDist < 0 || d < bestDist {
			best, bestDist = sub.Name, d
		}
	}
	// A suggestion further than a third of the word away is noise.
	if best != "" && bestDist <= max(2, len(name)/3) {
		return &usageError{msg: fmt.Sprintf("unknown command %q: did you mean %q?", prefix+name, prefix+best)}
	}
	return &usageError{msg: fmt.Sprintf("unknown command %q; see %s --help", prefix+name, path)}
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// helpCommand is `projector help [command ...]`.
func (c *cli) helpCommand(root *ffcli.Command) *ffcli.Command {
	return &ffcli.Command{
		Name:       "help",
		ShortUsage: "projector help [command ...]",
		ShortHelp:  "Show the usage of projector or of one of its commands.",
		Exec: func(_ context.Context, args []string) error {
			return c.help(root, root.Name, args)
		},
	}
}

// checked is a flag value whose refusal names the flag and the form it
// wants, and which refuses durations that must be positive.
type checked struct {
	flag.Value
	name string
	cli  *cli
}

// Set parses s, and on failure remembers the first refusal for execute:
// the flag package would wrap it in its own words and print the usage.
func (v *checked) Set(s string) error {
	err := v.set(s)
	if err != nil && v.cli.badValue == nil {
		v.cli.badValue = &usageError{msg: fmt.Sprintf("invalid value %q for --%s: %v", s, v.name, err)}
	}
	return err
}

func (v *checked) set(s string) error {
	getter, _ := v.Value.(flag.Getter)
	var was any
	if getter != nil {
		was = getter.Get()
	}
	if err := v.Value.Set(s); err != nil {
		switch was.(type) {
		case time.Duration:
			return errors.New("a duration like 500ms, 5s or 2m")
		case int, int64, uint, uint64:
			return errors.New("a whole number")
		case float64:
			return errors.New("a number")
		case bool:
			return errors.New("true or false")
		}
		return err
	}
	if d, ok := was.(time.Duration); ok {
		d = getter.Get().(time.Duration)
		allowed := zeroDurations[v.name]
		switch {
		case d < 0 && !allowed.negative:
			return errors.New("must not be negative")
		case d == 0 && !allowed.zero:
			return errors.New("must be positive, a duration like 500ms, 5s or 2m")
		}
	}
	return nil
}

// IsBoolFlag keeps a boolean flag usable without a value (--json).
func (v *checked) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Get returns the value underneath, for flag.Getter.
func (v *checked) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return v.Value.String()
}
