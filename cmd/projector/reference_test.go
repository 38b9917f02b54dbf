package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/freshness"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/readapi"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks/postgres"
)

// The references in docs/ are generated from the code; a test fails when
// they drift, and -update rewrites them.
var update = flag.Bool("update", false, "rewrite docs/configuration.md and docs/metrics.md from the code")

// checkGenerated fails the test when the file at path (relative to the
// repository root) is not want, or writes want there with -update.
func checkGenerated(t *testing.T, path, want string) {
	t.Helper()
	file := filepath.Join("..", "..", path)
	if *update {
		if err := os.WriteFile(file, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%s: %v (generate it with: make docs)", path, err)
	}
	if string(got) != want {
		t.Fatalf("%s is not what the code says; regenerate it with: make docs (go test ./cmd/projector -run 'TestConfigReference|TestMetricsReference' -update)\n%s",
			path, firstDifference(string(got), want))
	}
}

// firstDifference names the first line where got and want part.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n  file: %s\n  code: %s", i+1, gl, wl)
		}
	}
	return ""
}

// cell escapes s for a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

const configPreamble = `# Configuration reference

<!-- Generated from the commands' flag sets: edit the flags in cmd/projector and run make docs; TestConfigReference fails when this file drifts. -->

Most flags can also be set as an environment variable, which the tables
below and the command's ` + "`--help`" + ` name (see [Environment
variables](#environment-variables)); a flag on the command line wins.
Durations are Go durations (` + "`100ms`, `30s`, `2m`" + `) and must be
positive, except where a flag says what 0 or a negative value means; sizes
take ` + "`KiB`, `MiB`, `GiB`" + ` suffixes or plain bytes.

` + "`projector help [command]`" + ` or ` + "`--help`" + ` prints a command's usage and exits 0.
A command line that is wrong — an unknown command (the nearest is suggested),
an unknown flag, a value of the wrong form, an argument the command does not
take — is refused in one line on stderr with exit status 2, before anything
runs; ` + "`projector`" + `, ` + "`projector dlq`" + ` or ` + "`projector offsets`" + ` alone prints its usage
on stderr and exits 2 too. A command that ran and failed exits 1.

Passwords never appear in what the commands print: errors, logs, ` + "`dlq`" + `
output and the demo's summary mask a URL's password, credential query
parameters (` + "`password`, `sslpassword`, `token`, `api_key`" + `, …) and a
keyword/value connection string's ` + "`password`" + ` as ` + "`xxxxx`" + `. Give passwords
through the environment rather than a flag, which shows in ` + "`ps`" + `.

What the run-time flags do, and when to change them, is explained in
[operations.md](operations.md) and [performance.md](performance.md). The
projection file (` + "`--config`" + `) is described in [projections.md](projections.md).
The benchmark's flags are not part of the product: ` + "`make bench`" + ` runs it, and
its ` + "`--help`" + ` lists them (see [performance.md](performance.md)).

## Environment variables

A flag not given on the command line is read from its environment
variable. A variable has one meaning in every command that reads it: it
is ` + "`PROJECTOR_`" + ` and the flag name in upper case with ` + "`_`" + ` for ` + "`-`" + `
(` + "`--database-url`" + ` reads ` + "`PROJECTOR_DATABASE_URL`" + ` in every command), so that a
deployment sets it once for ` + "`run`" + `, ` + "`relay`" + ` and the tools. Where a
command's flag means something else than the flag of the same name of
another command, or has another default, its variable carries the
command's name too: relay's ` + "`--unready-after`" + ` (5s, waiting for the broker's
acknowledgement) reads ` + "`PROJECTOR_RELAY_UNREADY_AFTER`" + `, run's (30s, a
partition backing off) ` + "`PROJECTOR_UNREADY_AFTER`" + `. The filters of the ` + "`dlq`" + `
commands each have their own, so that a filter left set for ` + "`dlq list`" + `
does not decide what a replay or a purge selects.

The flags that confirm a destructive action — ` + "`--execute`" + ` of ` + "`offsets reset`" + `
and ` + "`dlq replay`" + `, ` + "`--dry-run`" + ` of ` + "`dlq replay`" + `, ` + "`--yes`" + ` of ` + "`dlq purge`" + `,
` + "`--take-over-identity`" + ` of ` + "`dev`" + ` — are taken from the command line only
(*command line only* in the tables): a variable left in a shell or a
deployment must not turn a dry run into a real one. When
` + "`PROJECTOR_EXECUTE`" + `, ` + "`PROJECTOR_DRY_RUN`" + ` or another such name is set, the
command says once on stderr that it ignores it, and does what its command
line says; ` + "`dlq purge`" + ` and ` + "`dev`" + ` go further and refuse to start while it
is set.

A ` + "`PROJECTOR_`" + ` variable that no command reads is reported before anything
runs. One a letter or two away from a variable that some command reads is
refused with exit status 2 (` + "`unknown environment variable\nPROJECTOR_DATABSE_URL: did you mean PROJECTOR_DATABASE_URL?`" + `), since the command
would otherwise quietly fall back to a default, such as the default
database; any other gets one warning line on stderr. A variable that
another command reads is not reported, as one environment may serve both
` + "`run`" + ` and ` + "`relay`" + `; nor are those Kubernetes gives every pod for a Service
named ` + "`projector`" + ` or ` + "`projector-…`" + ` of its namespace (` + "`PROJECTOR_SERVICE_HOST`" + `,
` + "`PROJECTOR_PORT=tcp://…`" + `, ` + "`PROJECTOR_PORT_8080_TCP_ADDR`" + `, …), nor the names that
the repository's scripts and tests read (a name ending in ` + "`_`" + ` stands for
every name it begins):
`

// envReference renders the names the commands do not report and the
// variables that carry their command's name, with the PROJECTOR_<FLAG>
// they do not read.
func envReference() string {
	var b strings.Builder
	b.WriteString("\n")
	names := make([]string, len(reservedEnv))
	for i, name := range reservedEnv {
		names[i] = "`" + name + "`"
	}
	b.WriteString(strings.Join(names, " "))
	b.WriteString("\n\nThe variables that carry their command's name. These flags do not read the\nname in the last column, which most of them read in earlier releases:\nit means what the other commands mean by it, or nothing.\n\n| command | flag | variable | not read |\n|---|---|---|---|\n")
	cmds := make([]string, 0, len(ownEnv))
	for cmd := range ownEnv {
		cmds = append(cmds, cmd)
	}
	sort.Strings(cmds)
	for _, cmd := range cmds {
		names := slices.Clone(ownEnv[cmd])
		sort.Strings(names)
		for _, name := range names {
			fmt.Fprintf(&b, "| `%s` | `--%s` | `%s` | `%s` |\n", cmd, name, envVar("projector "+cmd, name), envPrefix+envWord(name))
		}
	}
	return b.String()
}

// configReference renders every command's flags, in the order the
// command tree lists them.
func configReference(root *ffcli.Command) string {
	var b strings.Builder
	b.WriteString(configPreamble)
	b.WriteString(envReference())
	var walk func(path string, c *ffcli.Command)
	walk = func(path string, c *ffcli.Command) {
		if c.Name == "bench" {
			return // a development tool, documented in performance.md
		}
		if path != "projector" {
			fmt.Fprintf(&b, "\n## `%s`\n\n%s\n", path, c.ShortHelp)
			if c.ShortUsage != "" {
				fmt.Fprintf(&b, "\n```\n%s\n```\n", c.ShortUsage)
			}
			var flags []*flag.Flag
			if c.FlagSet != nil {
				c.FlagSet.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
			}
			if len(flags) > 0 {
				b.WriteString("\n| flag | environment | default | meaning |\n|---|---|---|---|\n")
				for _, f := range flags {
					kind, usage := flag.UnquoteUsage(f)
					name := "`--" + f.Name + "`"
					if kind != "" {
						name = "`--" + f.Name + " " + kind + "`"
					}
					def := "—"
					if f.DefValue != "" && !(kind == "" && f.DefValue == "false") {
						def = "`" + f.DefValue + "`"
					}
					v := "*command line only*"
					if e := envVar(path, f.Name); e != "" {
						v = "`" + e + "`"
					}
					fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, v, def, cell(usage))
				}
			}
		}
		for _, sub := range c.Subcommands {
			walk(path+" "+sub.Name, sub)
		}
	}
	walk("projector", root)
	return b.String()
}

// TestConfigReference holds docs/configuration.md to the flags the
// commands define.
func TestConfigReference(t *testing.T) {
	checkGenerated(t, "docs/configuration.md", configReference(rootCommand(io.Discard, io.Discard)))
}

// capture is a Registerer that remembers what was registered with it, so
// that the reference lists a metric before it has a sample.
// Collectors may be registered from the goroutine that runs the engine
// (its Kafka client's) while the test reads them.
type capture struct {
	*prometheus.Registry
	mu         sync.Mutex
	collectors []prometheus.Collector
}

func (c *capture) Register(col prometheus.Collector) error {
	if err := c.Registry.Register(col); err != nil {
		return err
	}
	c.mu.Lock()
	c.collectors = append(c.collectors, col)
	c.mu.Unlock()
	return nil
}

// registered returns what has been registered so far.
func (c *capture) registered() []prometheus.Collector {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.collectors)
}

func (c *capture) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// described are the names of the projector_ metrics c's collectors
// describe.
func (c *capture) described() []string {
	var names []string
	for _, col := range c.registered() {
		ch := make(chan *prometheus.Desc, 64)
		go func() { col.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil && strings.HasPrefix(m[1], "projector_") {
				names = append(names, m[1])
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// touch gives every labelled vector one child, so that Gather reports its
// type and labels before the code has used it.
func (c *capture) touch(t *testing.T) {
	t.Helper()
	for _, col := range c.registered() {
		var with func(lvs ...string) error
		switch v := col.(type) {
		case *prometheus.CounterVec:
			with = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.GaugeVec:
			with = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.HistogramVec:
			with = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		default:
			continue
		}
		ok := false
		for n := 0; n <= 8 && !ok; n++ {
			ok = with(slices.Repeat([]string{"x"}, n)...) == nil
		}
		if !ok {
			t.Fatalf("cannot give %T a child", col)
		}
	}
}

// families gathers the projector_ metrics, failing while one that is
// described has no sample yet.
func (c *capture) families() ([]*dto.MetricFamily, error) {
	fams, err := c.Gather()
	if err != nil {
		return nil, err
	}
	var out []*dto.MetricFamily
	got := map[string]bool{}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "projector_") {
			out = append(out, f)
			got[f.GetName()] = true
		}
	}
	for _, n := range c.described() {
		if !got[n] {
			return nil, fmt.Errorf("%s has no sample yet", n)
		}
	}
	return out, nil
}

// metricRow is one line of the metrics reference.
type metricRow struct{ name, kind, labels, help string }

func rowsOf(fams []*dto.MetricFamily) []metricRow {
	var rows []metricRow
	for _, f := range fams {
		var labels []string
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		rows = append(rows, metricRow{f.GetName(), strings.ToLower(f.GetType().String()), strings.Join(labels, ", "), f.GetHelp()})
	}
	return rows
}

func renderMetrics(b *strings.Builder, rows []metricRow) {
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	b.WriteString("| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, r := range rows {
		labels := "—"
		if r.labels != "" {
			labels = "`" + r.labels + "`"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", r.name, r.kind, labels, cell(r.help))
	}
}

// startupRetries is the one metric `run` and `relay` register themselves, inside their
// startup: it is not reachable from a test, and TestMetricsReference
// checks that every metric named in the code is in the reference.
var startupRetries = metricRow{"projector_startup_retries_total", "counter", "step",
	"Attempts of startup's database work (step: connect, migrate) that failed and were retried."}

const metricsPreamble = `# Metrics reference

<!-- Generated from the metric registry of the engine and the relay: edit the metrics in the code and run make docs; TestMetricsReference fails when this file drifts. -->

` + "`projector run`" + ` and ` + "`projector relay`" + ` serve Prometheus metrics on ` + "`/metrics`" + ` at
` + "`--http-addr`" + ` (default ` + "`:8080`" + `). Only the label names ` + "`group`, `topic`" + ` and
` + "`partition`" + ` are kafka-lag-exporter's: its metric names are not
(` + "`projector_consumer_lag`" + ` holds what its ` + "`kafka_consumergroup_group_lag`" + ` would,
measured against the offset stored in PostgreSQL), its other labels
(` + "`cluster_name`, `member_host`, `consumer_id`, `client_id`" + `) are absent, and
` + "`projector_consumer_lag_seconds`" + ` is the age of the oldest record not yet
committed rather than its interpolated estimate. A dashboard written for it
therefore needs its queries rewritten to these names. Nor can
kafka-lag-exporter measure projector itself: projector commits no offsets to
Kafka, so the group has none for it to read. Besides the metrics
below, both serve franz-go's client metrics (` + "`kgo_*`" + `: connections, bytes,
fetch and produce batches, from its ` + "`kprom`" + ` plugin), and the Go runtime's,
the process's and ` + "`go_build_info`" + `. Alert rules for these metrics are in
[` + "`deploy/prometheus/alerts.yml`" + `](../deploy/prometheus/alerts.yml); what to do
when one fires is in [operations.md](operations.md).
`

const metricsNotes = `
Reading them:

- Every metric of the engine carries ` + "`group`" + `, its consumer identity, and
  ` + "`generation`" + `, the generation of the projections it runs (1 for the
  deployment's identity; a rebuild runs another, see [rebuilds.md](rebuilds.md)),
  the client's ` + "`kgo_*`" + ` metrics too: engines of several identities in one
  process are exported side by side, each with its own series.
- ` + "`projector_consumer_lag`" + ` is absent while a partition's stored offset is past
  the log end (the topic was created again); ` + "`projector_partition_halted`" + ` says why.
- ` + "`projector_records_processed_total`" + ` counts records on arrival; a batch tried
  again after a failure is not counted twice.
- ` + "`projector_state_cache_lookups_total`" + ` and ` + "`projector_tombstone_checks_total`" + ` count
  per attempt of a batch. A high miss share with the cache at its bound
  (` + "`projector_state_cache_bytes`" + ` near ` + "`--state-cache-bytes`" + `) says the cache is too
  small for the stream's aggregates. About 1% probes is the tombstone filter
  at work; nearly all probes, a table with more than 1,000,000 tombstones.
- ` + "`projector_retries_total`" + `'s ` + "`reason`" + ` is ` + "`postgres`, `timeout`, `fold`, `dead_letter_storm`" + ` or ` + "`error`" + `.
- ` + "`projector_partition_stalled`" + ` makes ` + "`/livez`" + ` fail, so that the member is
  restarted; ` + "`projector_partition_halted`" + `, ` + "`projector_partition_statements_refused`" + `,
  ` + "`projector_partition_dead_letter_storm`" + ` and
  ` + "`projector_backoff_active`" + ` (past ` + "`--unready-after`" + `) make ` + "`/readyz`" + ` fail.
`

// TestMetricsReference holds docs/metrics.md to the metrics a running
// engine and a relay register.
func TestMetricsReference(t *testing.T) {
	m := codeMetrics(t)
	var b strings.Builder
	b.WriteString(metricsPreamble)
	b.WriteString("\n## `projector run`\n\n")
	renderMetrics(&b, append(rowsOf(m.engine), startupRetries))
	b.WriteString(metricsNotes)
	b.WriteString("\n## `projector relay`\n\n")
	renderMetrics(&b, append(rowsOf(m.relay), startupRetries))
	b.WriteString(apiMetricsIntro)
	renderMetrics(&b, rowsOf(apiMetrics(t)))
	doc := b.String()
	if err := namedInCode(doc); err != nil {
		t.Fatal(err)
	}
	checkGenerated(t, "docs/metrics.md", doc)
}

// registeredMetrics are the metric families a running engine and a relay
// register: the source of the metrics reference and of the alert rules'
// checks.
type registeredMetrics struct {
	engine, relay []*dto.MetricFamily // projector_*
	client        []*dto.MetricFamily // the engine's Kafka client's kgo_*
}

// codeMetrics runs an engine and builds a relay against a test database and
// broker, and gathers what they register once every metric has a sample.
func codeMetrics(t *testing.T) registeredMetrics {
	t.Helper()
	ctx := t.Context()
	db := testenv.NewDB(t)
	kafka := testenv.Kafka(t, demo.Topic, 1)
	_, reg := testenv.Registry(t)
	enc, err := demo.RegisterSchemas(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	projs, err := projection.Parse(demo.Projections, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, db.Pool, projs...); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	opts := demo.DefaultOptions()
	opts.Aggregates = 10
	if err := demo.Produce(ctx, cl, enc, demo.Generate(opts), nil); err != nil {
		t.Fatal(err)
	}

	f := &runFlags{}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	readers := map[string]avro.Schema{}
	for _, p := range projs {
		readers[p.Name] = enc.ReaderSchema()
	}
	engineMetrics := &capture{Registry: prometheus.NewRegistry()}
	e, err := newEngine(f, kafka.ListenAddrs(), projs, reg, readers, log, db.Pool, engineMetrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	go func() { done <- e.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	}()
	rebuild.NewMetrics(engineMetrics)
	engineMetrics.touch(t)
	var engineFams []*dto.MetricFamily
	// The lag of a partition is known once its worker has fetched.
	testenv.WaitFor(t, time.Minute, func() error {
		engineFams, err = engineMetrics.families()
		return err
	})

	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	relayMetrics := &capture{Registry: prometheus.NewRegistry()}
	if _, err := outbox.New(db.Pool, outbox.Config{Client: producer, Logger: log, Registerer: relayMetrics}); err != nil {
		t.Fatal(err)
	}
	relayMetrics.touch(t)
	relayFams, err := relayMetrics.families()
	if err != nil {
		t.Fatal(err)
	}
	all, err := engineMetrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var client []*dto.MetricFamily
	for _, f := range all {
		if strings.HasPrefix(f.GetName(), "kgo_") {
			client = append(client, f)
		}
	}
	return registeredMetrics{engine: engineFams, relay: relayFams, client: client}
}

// metricName is a metric name as the code spells it in a literal.
var metricName = regexp.MustCompile(`"(projector_[a-z_]+)"`)

// namedInCode checks that every metric a Prometheus constructor names in
// the code, outside tests, is in doc: one the test cannot reach would
// otherwise be missing unnoticed.
func namedInCode(doc string) error {
	var missing []string
	err := filepath.WalkDir(filepath.Join("..", ".."), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Hidden directories hold no code, but may hold a running
		// broker's data, which changes under the walk.
		hidden := strings.HasPrefix(d.Name(), ".") && d.Name() != ".."
		if d.IsDir() && (hidden || d.Name() == "bench" || strings.HasSuffix(path, "projector-bench")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, line := range bytes.Split(src, []byte("\n")) {
			if !bytes.Contains(line, []byte("Name:")) && !bytes.Contains(line, []byte("NewDesc(")) {
				continue
			}
			for _, m := range metricName.FindAllSubmatch(line, -1) {
				if n := string(m[1]); !strings.Contains(doc, "`"+n+"`") {
					missing = append(missing, n+" ("+path+")")
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return errors.New("metrics named in the code but not in the reference: " + strings.Join(missing, ", "))
	}
	return nil
}

// markdownLink is a Markdown link's target.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// slug is the anchor GitHub gives a heading.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the anchors of the headings of the Markdown file at path,
// outside code blocks; nil when it cannot be read.
func anchors(path string) map[string]bool {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	fence := false
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			out[slug(strings.TrimLeft(line, "#"))] = true
		}
	}
	return out
}

// TestDocLinks: every relative link of the README and of docs/ names a
// file that exists and, with an anchor, a heading in it, so that pages
// moved or renamed leave no dead links behind.
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "README.md"))
	for _, page := range pages {
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(src), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", page, target, err)
				continue
			}
			if anchor != "" && !anchors(path)[anchor] {
				t.Errorf("%s: link %s: no heading %q in %s", page, target, anchor, path)
			}
		}
	}
}

const apiMetricsIntro = "\n## The read API: `projector serve` and `projector run --api`\n\n" +
	"`projector serve` serves these on `/metrics` at its `--http-addr` (default `:8080`), with " +
	"`projector_startup_retries_total` and the Go runtime's; `projector run --api` adds them to the engine's. " +
	"`route` is the route's pattern (`/v1/projections/{name}/rows/{key}`, `/v1/projections/{name}/rows`, `/openapi.json`, or `other`), never the path asked for.\n\n"

// apiMetrics are the metric families the read API registers.
func apiMetrics(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	projs, err := projection.Parse(demo.Projections, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := readapi.New(readapi.Config{Projections: projs, DB: noQuerier{}, Authenticator: auth.None{}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	// The watcher of min_version waits, which serve and run --api run
	// beside the API.
	if _, err := freshness.NewWatcher(nil, projs, freshness.Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// noQuerier stands for a database the metrics reference never queries.
type noQuerier struct{}

func (noQuerier) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("not queried")
}
