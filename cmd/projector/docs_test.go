package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/projector-dev/projector/internal/testenv"
)

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = "../.."

// docFiles are the documents whose command examples are run and whose paths
// must exist.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(docs)
	files := append([]string{filepath.Join(repoRoot, "README.md")}, docs...)
	return append(files, filepath.Join(repoRoot, "deploy", "README.md"))
}

// docBlock is one fenced code block of a document.
type docBlock struct {
	file   string // relative to the repository's root
	line   int    // of the opening fence
	notRun string // the reason of a "<!-- not run: REASON -->" line just before it
	// journey: the block is part of the README's five-minute path, which
	// TestReadmeJourney runs.
	journey bool
	lines   []string // without the fence's indentation
}

func (b docBlock) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	fenceRE   = regexp.MustCompile("^( *)```([A-Za-z0-9_+-]*)\\s*$")
	notRunRE  = regexp.MustCompile(`^<!-- not run: (\S.*?) -->$`)
	journeyRE = regexp.MustCompile(`^<!-- journey: \S+ -->$`)
)

// docBlocks returns the fenced code blocks of the markdown text.
func docBlocks(file, text string) []docBlock {
	var (
		out    []docBlock
		cur    *docBlock
		indent int
		before string // the last non-blank line outside a block
	)
	for i, l := range strings.Split(text, "\n") {
		if cur != nil {
			if strings.TrimSpace(l) == "```" {
				out = append(out, *cur)
				cur = nil
				continue
			}
			cur.lines = append(cur.lines, strings.TrimPrefix(l, strings.Repeat(" ", indent)))
			continue
		}
		if m := fenceRE.FindStringSubmatch(l); m != nil {
			indent = len(m[1])
			cur = &docBlock{file: file, line: i + 1, journey: journeyRE.MatchString(before)}
			if m := notRunRE.FindStringSubmatch(before); m != nil {
				cur.notRun = m[1]
			}
			continue
		}
		if strings.TrimSpace(l) != "" {
			before = strings.TrimSpace(l)
		}
	}
	return out
}

// docCommand is one command line of a code block and what the document
// shows after it.
type docCommand struct {
	line   string   // as written, continuation lines joined
	words  []string // shell words
	stdin  string   // the text piped in by `echo '…' |`
	input  string   // the file redirected in by `< file`
	output []string // the lines shown after it, up to the next command
}

// docCommands splits a block into its commands. In a block where commands
// are prompted ("$ "), every other line is output (a `$ cat FILE`'s output
// is that file's text); elsewhere a line that starts, unindented, with a
// projector command is one, and the lines after it are its output.
func docCommands(b docBlock, subcommands []string) []*docCommand {
	var logical []string
	for i := 0; i < len(b.lines); i++ {
		l := b.lines[i]
		for strings.HasSuffix(l, `\`) && i+1 < len(b.lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(b.lines[i])
		}
		logical = append(logical, l)
	}
	prompted := slices.ContainsFunc(logical, func(l string) bool { return strings.HasPrefix(l, "$ ") })
	var (
		out []*docCommand
		cur *docCommand
	)
	for _, l := range logical {
		text, isCommand := l, false
		if prompted {
			text, isCommand = strings.CutPrefix(l, "$ ")
		} else if !strings.HasPrefix(l, " ") {
			w, _ := docWords(l)
			isCommand = len(w) >= 2 && w[0] == "projector" && slices.Contains(subcommands, w[1])
		}
		if !isCommand {
			if cur != nil {
				cur.output = append(cur.output, l)
			}
			continue
		}
		cur = &docCommand{line: text}
		cur.words, cur.input = docWords(text)
		if i := slices.Index(cur.words, "|"); i == 2 && cur.words[0] == "echo" {
			cur.stdin = cur.words[1] + "\n"
			cur.words = cur.words[3:]
		}
		out = append(out, cur)
	}
	return out
}

// docWords splits a command line as a POSIX shell would for the forms the
// documents use: words, single and double quotes, a backslash, a trailing
// comment, a pipe and "< file" (returned apart).
func docWords(line string) (words []string, input string) {
	var (
		w      strings.Builder
		inWord bool
		quote  byte
	)
	flush := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
loop:
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			w.WriteByte(c)
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			inWord = true
		case c == '#' && !inWord:
			break loop
		case c == ' ' || c == '\t':
			flush()
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	flush()
	if i := slices.Index(words, "<"); i >= 0 && i+1 < len(words) {
		input = words[i+1]
		words = slices.Delete(words, i, i+2)
	}
	return words, input
}

// synopsis reports whether words are a usage line ("projector dlq show ID
// [flags]", "projector offsets <list|reset|audit>") rather than an example.
func synopsis(words []string) bool {
	return slices.ContainsFunc(words, func(w string) bool {
		return strings.HasPrefix(w, "[") || strings.HasPrefix(w, "(") || (len(w) > 1 && strings.HasPrefix(w, "<")) || strings.Contains(w, "...")
	})
}

// longRunning are the commands that serve until stopped: an example of one
// passes once its /readyz answers 200, and it must then stop cleanly.
var longRunning = []string{"run", "relay", "dev"}

// docWorld is what the documents' examples speak of: one deployment whose
// identity accounts-projector consumes accounts.events into the table
// accounts (examples/projections.yaml), with stored offsets and an open
// dead letter of class decode; and the files a reader has at hand.
type docWorld struct {
	t        *testing.T
	dir      string
	brokers  string
	registry string
	db       *testenv.DB
	root     *ffcli.Command
}

// docFixtures are the files the examples name, by the name they use:
// the projection files and schemas of examples/, the demo's schema, and the
// README's own account.avsc and events.jsonl.
func docFixtures(t *testing.T) map[string]string {
	t.Helper()
	read := func(p ...string) string {
		b, err := os.ReadFile(filepath.Join(append([]string{repoRoot}, p...)...))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	blocks := readmeBlocks(t)
	return map[string]string{
		"projections.yaml":   read("examples", "projections.yaml"),
		"saga.yaml":          read("examples", "saga.yaml"),
		"snapshot.yaml":      read("examples", "snapshot.yaml"),
		"saga.avsc":          read("examples", "saga.avsc"),
		"account_event.avsc": read("internal", "demo", "account_event.avsc"),
		"account.avsc":       blocks["account.avsc"],
		"events.jsonl":       blocks["events.jsonl"],
	}
}

func newDocWorld(t *testing.T) *docWorld {
	t.Helper()
	w := &docWorld{t: t, dir: t.TempDir(), db: testenv.NewDB(t), root: rootCommand(io.Discard, io.Discard)}
	for name, text := range docFixtures(t) {
		if err := os.WriteFile(filepath.Join(w.dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kafka := testenv.Kafka(t, "accounts.events", 6, kfake.SeedTopics(3, "orders.saga", "customers"))
	w.brokers = strings.Join(kafka.ListenAddrs(), ",")
	reg, _ := testenv.Registry(t)
	w.registry = reg.URL()

	// The deployment: events of two accounts and a record that is not
	// Avro, applied by a member of accounts-projector that then stops.
	events := `{"account_id": "acc-1", "version": 1, "type": "AccountOpened", "owner": "Ada", "occurred_at": "2026-12-01T09:00:00Z"}
{"account_id": "acc-1", "version": 2, "type": "Deposited", "amount": 250, "occurred_at": "2026-12-01T09:05:00Z"}
{"account_id": "acc-2", "version": 1, "type": "AccountOpened", "owner": "Grace", "occurred_at": "2026-12-01T09:10:00Z"}
`
	w.write("seed.jsonl", events)
	w.write("seed.hex", "6e 6f 74 20 61 76 72 6f\n")
	w.mustRun("projector", "produce", "--brokers", w.brokers, "--registry-url", w.registry, "--topic", "accounts.events",
		"--schema", w.path("account_event.avsc"), "--key-field", "account_id", "--file", w.path("seed.jsonl"))
	w.mustRun("projector", "produce", "--brokers", w.brokers, "--topic", "accounts.events", "--format", "hex", "--key", "acc-3", "--file", w.path("seed.hex"))
	stop := w.start([]string{"run", "--brokers", w.brokers, "--registry-url", w.registry, "--database-url", w.db.URL,
		"--identity", "accounts-projector", "--config", w.path("projections.yaml"), "--http-addr", "127.0.0.1:0"})
	testenv.WaitFor(t, 30*time.Second, func() error {
		var letters, accounts int
		if err := w.db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM projector_dead_letters), (SELECT count(*) FROM accounts)`).Scan(&letters, &accounts); err != nil {
			return err
		}
		if letters != 1 || accounts != 2 {
			return fmt.Errorf("the seeding member has applied %d accounts and %d dead letters, want 2 and 1", accounts, letters)
		}
		return nil
	})
	stop()
	return w
}

func (w *docWorld) path(name string) string { return filepath.Join(w.dir, name) }

func (w *docWorld) write(name, text string) {
	w.t.Helper()
	if err := os.MkdirAll(filepath.Dir(w.path(name)), 0o700); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(w.path(name), []byte(text), 0o600); err != nil {
		w.t.Fatal(err)
	}
}

// mustRun runs a command line the test itself needs.
func (w *docWorld) mustRun(words ...string) {
	w.t.Helper()
	var out syncBuffer
	if err := Main(w.t.Context(), words[1:], &out, &out); err != nil {
		w.t.Fatalf("%s: %v\n%s", strings.Join(words, " "), err, out.String())
	}
}

// command returns the subcommand args name (e.g. "dlq list") and its
// name, or nil.
func (w *docWorld) command(args []string) (*ffcli.Command, string) {
	cmd, path := w.root, []string{}
	for _, a := range args {
		i := slices.IndexFunc(cmd.Subcommands, func(c *ffcli.Command) bool { return c.Name == a })
		if i < 0 {
			break
		}
		cmd, path = cmd.Subcommands[i], append(path, a)
	}
	if cmd == w.root {
		return nil, ""
	}
	return cmd, strings.Join(path, " ")
}

// services are the flags whose value names a service; the test's own
// service stands in for the one the document names.
func (w *docWorld) services() map[string]string {
	return map[string]string{
		"brokers":       w.brokers,
		"registry-url":  w.registry,
		"database-url":  w.db.URL,
		"http-addr":     "127.0.0.1:0",
		"brokers-addr":  "127.0.0.1:0",
		"registry-addr": "127.0.0.1:0",
	}
}

// args prepares an example's words (without "projector") to run here: a
// service flag's value is replaced by the test's service; one the example
// does not give is added only when the command has a default for it (the
// local service the document relies on), so that an example missing a
// flag the command requires fails as it would for a reader; a file the
// example names is the fixture of that name.
func (w *docWorld) args(cmd *ffcli.Command, words []string) []string {
	services := w.services()
	out := slices.Clone(words)
	given := map[string]bool{}
	for i := 0; i < len(out); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(out[i], "-"), "=")
		if !strings.HasPrefix(out[i], "-") {
			if p := w.path(out[i]); fileExists(p) {
				out[i] = p
			}
			continue
		}
		given[name] = true
		s, ok := services[name]
		if !ok {
			if hasValue && fileExists(w.path(value)) {
				out[i] = "--" + name + "=" + w.path(value)
			}
			continue
		}
		if hasValue {
			out[i] = "--" + name + "=" + s
		} else if i+1 < len(out) {
			out[i+1] = s
			i++
		}
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range services {
			if !yield(k) {
				return
			}
		}
	}) {
		if f := cmd.FlagSet.Lookup(name); f != nil && !given[name] && f.DefValue != "" {
			out = append(out, "--"+name, services[name])
		}
	}
	return out
}

// run runs one projector command with stdin, returning what it printed.
func (w *docWorld) run(args []string, stdin string) (string, error) {
	// rootCommand hands produce os.Stdin: the example's input replaces it
	// for the call (no test of this package runs beside this one, which
	// is not parallel).
	f, err := os.CreateTemp(w.dir, "stdin")
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(stdin); err != nil {
		w.t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		w.t.Fatal(err)
	}
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved }()
	var out syncBuffer
	err = Main(w.t.Context(), args, &out, &out)
	return out.String(), err
}

var servingRE = regexp.MustCompile(`serving metrics and health"?[^\n]*?\baddr"?[=:]"?([^"\s,}]+)`)

// start runs a long-running command until its /readyz answers 200, and
// returns what stops it; stopping must end it without an error.
func (w *docWorld) start(args []string) (stop func()) {
	w.t.Helper()
	ctx, cancel := context.WithCancel(w.t.Context())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- Main(ctx, args, &out, &out) }()
	stop = func() {
		w.t.Helper()
		cancel()
		if err := <-done; err != nil {
			w.t.Errorf("projector %s did not stop cleanly: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	var ended error
	testenv.WaitFor(w.t, 30*time.Second, func() error {
		select {
		case err := <-done:
			ended = fmt.Errorf("it ended: %v", err)
			return nil
		default:
		}
		m := servingRE.FindStringSubmatch(out.String())
		if m == nil {
			return fmt.Errorf("projector %s serves no /readyz yet:\n%s", strings.Join(args, " "), out.String())
		}
		resp, err := http.Get("http://" + m[1] + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("projector %s: /readyz answers %s", strings.Join(args, " "), resp.Status)
		}
		return nil
	})
	if ended != nil {
		cancel()
		w.t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), ended, out.String())
	}
	return stop
}

// headerRE matches a table's header line as the commands print it.
var headerRE = regexp.MustCompile(`^[A-Z][A-Z-]*( {2,}[A-Z][A-Z-]*)+\s*$`)

// example runs one command example and says how it differs from what the
// document shows: an example the document shows failing (its output ends
// in "projector: …") must fail, any other must succeed; a table header the
// document shows must be the one printed.
func (w *docWorld) example(b docBlock, c *docCommand) error {
	cmd, name := w.command(c.words[1:])
	if cmd == nil {
		return fmt.Errorf("%q: projector has no such command", c.line)
	}
	args := append(strings.Fields(name), w.args(cmd, c.words[1+len(strings.Fields(name)):])...)
	if slices.Contains(longRunning, strings.Fields(name)[0]) {
		w.start(args)()
		return nil
	}
	stdin := c.stdin
	if c.input != "" {
		text, err := os.ReadFile(w.path(c.input))
		if err != nil {
			return fmt.Errorf("%q reads %s, which the test does not have: add it to docFixtures or mark the block <!-- not run: … -->", c.line, c.input)
		}
		stdin = string(text)
	}
	out, err := w.run(args, stdin)
	// The failure the document shows: what failed, the words before the
	// error's first colon ("check found problems", "could not check").
	var wantFail string
	for _, l := range c.output {
		if msg, ok := strings.CutPrefix(l, "projector: "); ok {
			wantFail, _, _ = strings.Cut(msg, ":")
			break
		}
	}
	switch {
	case err != nil && wantFail == "":
		return fmt.Errorf("%q fails: %v\n%s", c.line, err, out)
	case err == nil && wantFail != "":
		return fmt.Errorf("%q succeeds, but the document shows it failing (%s):\n%s", c.line, wantFail, out)
	case err != nil && !strings.HasPrefix(err.Error(), wantFail):
		return fmt.Errorf("%q fails with %q, but the document shows it failing with %q", c.line, err, wantFail)
	}
	if len(c.output) > 0 && headerRE.MatchString(c.output[0]) {
		first, _, _ := strings.Cut(out, "\n")
		if got, want := strings.Fields(first), strings.Fields(c.output[0]); !slices.Equal(got, want) {
			return fmt.Errorf("%q prints the header %q, the document shows %q", c.line, got, want)
		}
	}
	return nil
}

// TestDocExamples runs every projector command example of the documents
// (README.md, docs/*.md, deploy/README.md) against an embedded broker and
// registry and the test database: each example as written, with the
// addresses of the test's own services. A block that cannot run here is
// marked in the document with "<!-- not run: REASON -->" on the line before
// it, and listed by this test; the README's five-minute path is
// TestReadmeJourney's. Lines of other programs (docker, kubectl, psql, make,
// go, scripts/…) are not projector's examples; usage synopses ("[flags]")
// are not examples.
func TestDocExamples(t *testing.T) {
	w := newDocWorld(t)
	var subcommands []string
	for _, c := range w.root.Subcommands {
		subcommands = append(subcommands, c.Name)
	}
	ran := 0
	for _, file := range docFiles(t) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, file)
		for _, b := range docBlocks(filepath.ToSlash(rel), string(text)) {
			cmds := docCommands(b, subcommands)
			var examples []*docCommand
			for _, c := range cmds {
				if len(c.words) == 2 && c.words[0] == "cat" {
					// "$ cat FILE" shows the file the next commands read.
					w.write(c.words[1], strings.Join(c.output, "\n")+"\n")
					continue
				}
				if len(c.words) > 0 && c.words[0] == "projector" && !synopsis(c.words) {
					examples = append(examples, c)
				}
			}
			switch {
			case len(examples) == 0:
				continue
			case b.journey:
				continue
			case b.notRun != "":
				t.Logf("%s: not run: %s", b, b.notRun)
				continue
			}
			for _, c := range examples {
				if err := w.example(b, c); err != nil {
					t.Errorf("%s: %v", b, err)
				} else {
					t.Logf("%s: ran %s", b, c.line)
				}
				ran++
			}
		}
	}
	if ran < 10 {
		t.Errorf("ran %d examples of the documents; they hold more: is the extraction broken?", ran)
	}
	t.Logf("ran %d examples", ran)
}

// repoPathRE matches a relative path of the repository: at least one
// directory and a name; whether its first directory is one of the
// repository's decides whether it is one.
var repoPathRE = regexp.MustCompile(`(?:^|[\s"'(=\[])((?:\.\./|\./)*[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.*-]*)+/?)`)

// TestDocPaths: every relative link of the documents and every repository
// path they or the example files name (in backquotes, in code blocks, in
// the examples' comments) exists.
func TestDocPaths(t *testing.T) {
	top := map[string]bool{}
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			top[e.Name()] = true
		}
	}
	files := docFiles(t)
	examples, err := filepath.Glob(filepath.Join(repoRoot, "examples", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range examples {
		// A directory of examples/ is an example program, not a file the
		// documents' paths are read from.
		if st, err := os.Stat(e); err == nil && !st.IsDir() {
			files = append(files, e)
		}
	}
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeRE := regexp.MustCompile("`([^`\n]+)`")
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, file)
		dir := filepath.Dir(file)
		exists := func(p string) bool {
			p = strings.TrimSuffix(p, "/")
			for _, base := range []string{dir, repoRoot} {
				if m, _ := filepath.Glob(filepath.Join(base, p)); len(m) > 0 {
					return true
				}
			}
			return false
		}
		sc := bufio.NewScanner(strings.NewReader(string(text)))
		sc.Buffer(nil, 1<<20)
		inBlock := false
		for n := 1; sc.Scan(); n++ {
			l := sc.Text()
			if fenceRE.MatchString(l) || (inBlock && strings.TrimSpace(l) == "```") {
				inBlock = !inBlock
				continue
			}
			var candidates []string
			if strings.HasSuffix(file, ".md") {
				for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
					target, anchor, hasAnchor := strings.Cut(m[1], "#")
					if strings.Contains(target, ":") {
						continue // a URL
					}
					checked++
					if target != "" && !exists(target) {
						t.Errorf("%s:%d: link to %s, which does not exist", rel, n, target)
						continue
					}
					page := file
					if target != "" {
						page = filepath.Join(dir, target)
					}
					if hasAnchor && strings.HasSuffix(page, ".md") && !slices.Contains(headingAnchors(t, page), anchor) {
						t.Errorf("%s:%d: link to %s, whose page has no heading %q", rel, n, m[1], anchor)
					}
				}
			}
			switch {
			case inBlock || !strings.HasSuffix(file, ".md"):
				candidates = []string{l}
			default:
				for _, m := range codeRE.FindAllStringSubmatch(l, -1) {
					candidates = append(candidates, m[1])
				}
			}
			for _, c := range candidates {
				for _, m := range repoPathRE.FindAllStringSubmatch(c, -1) {
					p := strings.TrimRight(m[1], ".,:;") // the sentence's, not the path's
					first, _, _ := strings.Cut(strings.TrimLeft(p, "./"), "/")
					if !top[first] && !strings.HasPrefix(p, ".") {
						continue // not a path of the repository
					}
					checked++
					if !exists(p) {
						t.Errorf("%s:%d: names %s, which does not exist", rel, n, p)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d paths; the documents name more: is the extraction broken?", checked)
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a
// markdown file: lower case, spaces as dashes, punctuation dropped, a
// repeated one numbered.
func headingAnchors(t *testing.T, file string) []string {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var (
		out    []string
		seen   = map[string]int{}
		inCode bool
	)
	for _, l := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inCode = !inCode
		}
		h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " ")
		if inCode || !ok || !strings.HasPrefix(l, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
