package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// The alert rules shipped beside the deployment files, and promtool's unit
// tests of them.
var (
	alertsFile     = filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml")
	alertTestsFile = filepath.Join("..", "..", "deploy", "prometheus", "alerts_test.yml")
)

// alertRules is the part of a Prometheus rule file the checks read.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// targetLabels are the labels Prometheus adds to every scraped series, so
// that a rule may group by them though no metric declares them.
var targetLabels = map[string]bool{"instance": true, "job": true}

// severities are the values the severity label may take; Alertmanager
// routes on them.
var severities = map[string]bool{"critical": true, "warning": true, "info": true}

// TestAlertRules holds deploy/prometheus/alerts.yml to the metrics the code
// registers: a rule naming a metric or a label that does not exist would
// never fire, and nothing else would notice. Every alert carries what the
// receiver needs: a severity, a summary, a description and a runbook link
// to a heading of docs/operations.md.
func TestAlertRules(t *testing.T) {
	rules := readAlertRules(t)
	m := codeMetrics(t)
	labels := map[string][]string{} // metric name → its labels
	for _, f := range slices.Concat(m.engine, m.relay, m.client) {
		var ls []string
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				ls = append(ls, l.GetName())
			}
		}
		labels[f.GetName()] = ls
	}
	labels[startupRetries.name] = strings.Split(startupRetries.labels, ", ")

	runbook := runbookPrefix(t)
	headings := anchors(filepath.Join("..", "..", "docs", "operations.md"))
	if len(headings) == 0 {
		t.Fatal("docs/operations.md has no headings")
	}

	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = "record " + r.Record
			} else {
				alerts++
			}
			q, err := parseQuery(r.Expr)
			if err != nil {
				t.Errorf("%s: expr: %v", name, err)
				continue
			}
			if len(q.metrics) == 0 {
				t.Errorf("%s: expr %q names no projector_ or kgo_ metric", name, r.Expr)
			}
			for metric, matchers := range q.metrics {
				have, ok := labels[metric]
				if !ok {
					t.Errorf("%s: expr uses %s, which the code does not register (see docs/metrics.md)", name, metric)
					continue
				}
				for _, l := range matchers {
					if !slices.Contains(have, l) && !targetLabels[l] {
						t.Errorf("%s: expr matches label %q of %s, which has only %v", name, l, metric, have)
					}
				}
				for _, l := range q.grouping {
					if !slices.Contains(have, l) && !targetLabels[l] {
						t.Errorf("%s: expr groups by label %q, which %s does not have (it has %v)", name, l, metric, have)
					}
				}
			}
			if r.Alert == "" {
				continue
			}
			if !severities[r.Labels["severity"]] {
				t.Errorf("%s: label severity is %q, want one of critical, warning, info", name, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: annotation %s is missing", name, a)
				}
			}
			// A label the text shows must be one the alert has, or it
			// renders as "<no value>".
			result := q.by
			if result == nil {
				result = slices.Collect(maps.Keys(targetLabels))
				for metric := range q.metrics {
					result = append(result, labels[metric]...)
				}
			}
			for a, text := range r.Annotations {
				for _, mm := range templateLabel.FindAllStringSubmatch(text, -1) {
					if !slices.Contains(result, mm[1]) {
						t.Errorf("%s: annotation %s shows $labels.%s, which the alert does not have (it has %v)", name, a, mm[1], result)
					}
				}
			}
			// Metrics the text tells the reader to look at must exist too.
			for _, a := range []string{"summary", "description"} {
				for _, mm := range annotationMetric.FindAllString(r.Annotations[a], -1) {
					if _, ok := labels[mm]; !ok {
						t.Errorf("%s: annotation %s names %s, which the code does not register", name, a, mm)
					}
				}
			}
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbook)
			switch {
			case url == "":
				t.Errorf("%s: annotation runbook_url is missing; want %s<heading>", name, runbook)
			case !ok:
				t.Errorf("%s: runbook_url %q does not point into docs/operations.md (%s<heading>)", name, url, runbook)
			case !headings[anchor]:
				t.Errorf("%s: runbook_url %q: docs/operations.md has no heading %q", name, url, anchor)
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("%s has no alert rules", alertsFile)
	}
}

// templateLabel is a label an annotation's template shows.
var templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// annotationMetric is a metric name in an annotation's text.
var annotationMetric = regexp.MustCompile(`\b(?:projector|kgo)_[a-z_]*[a-z]`)

// runbookPrefix is where the runbook links point: docs/operations.md in
// the repository the module path names.
func runbookPrefix(t *testing.T) string {
	t.Helper()
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := bytes.Cut(mod, []byte("\n"))
	path, ok := strings.CutPrefix(strings.TrimSpace(string(line)), "module ")
	if !ok {
		t.Fatalf("go.mod: first line %q is not the module path", line)
	}
	return "https://" + path + "/blob/main/docs/operations.md#"
}

func readAlertRules(t *testing.T) alertRules {
	t.Helper()
	src, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return rules
}

// query is what the checks need of a PromQL expression: the projector_ and
// kgo_ metrics it selects with the labels each one's matchers name, and the
// labels its by/on/... clauses name. A clause's labels are checked against
// every metric of the expression, which is right for the rules' shape (one
// metric, or two joined on labels both have).
type query struct {
	metrics  map[string][]string
	grouping []string
	// by are the labels every by clause keeps, the only ones its result
	// has besides alertname and the rule's labels; nil without one.
	by []string
}

// groupingKeywords are the PromQL keywords followed by a label list.
var groupingKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// parseQuery reads expr's metrics and labels. It is a tokenizer, not a
// PromQL parser (promtool check rules, below, is that): enough to find
// names that do not exist.
func parseQuery(expr string) (query, error) {
	toks, err := tokens(expr)
	if err != nil {
		return query{}, err
	}
	q := query{metrics: map[string][]string{}}
	// list reads "( a, b )" from toks[i], returning the names and the
	// index after ')'.
	list := func(i int, open, closing string, pairs bool) ([]string, int, error) {
		if i >= len(toks) || toks[i] != open {
			return nil, i, nil
		}
		var names []string
		for i++; i < len(toks) && toks[i] != closing; i++ {
			tok := toks[i]
			if tok == "," {
				continue
			}
			if !isIdent(tok) {
				return nil, i, fmt.Errorf("%q: want a label name, got %q", expr, tok)
			}
			names = append(names, tok)
			if pairs { // label op "value"
				if i+2 >= len(toks) || !strings.HasPrefix(toks[i+2], `"`) {
					return nil, i, fmt.Errorf("%q: matcher of label %s has no quoted value", expr, tok)
				}
				i += 2
			}
		}
		if i >= len(toks) {
			return nil, i, fmt.Errorf("%q: %q is not closed", expr, open)
		}
		return names, i + 1, nil
	}
	for i := 0; i < len(toks); {
		tok := toks[i]
		switch {
		case groupingKeywords[tok]:
			names, next, err := list(i+1, "(", ")", false)
			if err != nil {
				return query{}, err
			}
			q.grouping = append(q.grouping, names...)
			if tok == "by" {
				if q.by == nil {
					q.by = names
				} else {
					q.by = slices.DeleteFunc(q.by, func(l string) bool { return !slices.Contains(names, l) })
				}
			}
			i = max(next, i+1)
		case strings.HasPrefix(tok, "projector_") || strings.HasPrefix(tok, "kgo_"):
			names, next, err := list(i+1, "{", "}", true)
			if err != nil {
				return query{}, err
			}
			q.metrics[tok] = append(q.metrics[tok], names...)
			i = max(next, i+1)
		default:
			i++
		}
	}
	return q, nil
}

func isIdent(s string) bool {
	return s != "" && (unicode.IsLetter(rune(s[0])) || s[0] == '_')
}

// tokens splits a PromQL expression into names, numbers, quoted strings,
// range brackets and operators.
func tokens(expr string) ([]string, error) {
	var out []string
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, errors.New("unterminated string in " + expr)
			}
			out = append(out, `"`+expr[i+1:j]+`"`)
			i = j + 1
		case c == '[':
			// A range or subquery: its durations are not names.
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, errors.New("unterminated [ in " + expr)
			}
			i += j + 1
		case c == '_' || c == ':' || unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)) || c == '.':
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j] == ':' || expr[j] == '.' ||
				unicode.IsLetter(rune(expr[j])) || unicode.IsDigit(rune(expr[j]))) {
				j++
			}
			out = append(out, expr[i:j])
			i = j
		case strings.ContainsRune("=!~<>", rune(c)):
			j := i
			for j < len(expr) && strings.ContainsRune("=!~<>", rune(expr[j])) {
				j++
			}
			out = append(out, expr[i:j])
			i = j
		default:
			out = append(out, string(c))
			i++
		}
	}
	return out, nil
}

// alertTests is the part of a promtool rule test file the coverage check
// reads.
type alertTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertRuleTests []struct {
			Alertname string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertRuleTestsCover: deploy/prometheus/alerts_test.yml tests every
// alert both ways, firing and quiet, so that a rule added or changed
// without a test is caught here, with or without promtool.
func TestAlertRuleTestsCover(t *testing.T) {
	src, err := os.ReadFile(alertTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.Unmarshal(src, &tests); err != nil {
		t.Fatalf("%s: %v", alertTestsFile, err)
	}
	// Expected annotations copied from promtool's output would otherwise
	// hold a template's missing label as if it were right.
	if bytes.Contains(src, []byte("<no value>")) {
		t.Errorf("%s expects an annotation with <no value>: its template shows a label the alert does not have", alertTestsFile)
	}
	if !slices.Contains(tests.RuleFiles, "alerts.yml") {
		t.Errorf("%s: rule_files is %v, want alerts.yml", alertTestsFile, tests.RuleFiles)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range readAlertRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no test in which %s fires", alertTestsFile, r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no test in which %s stays quiet", alertTestsFile, r.Alert)
			}
		}
	}
}

// TestAlertRulesPromtool has Prometheus's own tool parse the rules and run
// their unit tests. Without promtool on PATH it is skipped; CI installs it.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH (Debian package prometheus): the alert rules' unit tests in deploy/prometheus/alerts_test.yml are not run")
	}
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertTestsFile}} {
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestParseQuery: the tokenizer finds metrics, matchers and grouping labels
// in the PromQL shapes rules are written in, so that TestAlertRules checks
// what an expression really uses.
func TestParseQuery(t *testing.T) {
	for _, tc := range []struct {
		expr         string
		metrics      map[string][]string
		grouping, by []string
		wantErr      bool
	}{
		{expr: `max by (group, topic) (projector_consumer_lag_seconds) > 300`,
			metrics: map[string][]string{"projector_consumer_lag_seconds": nil}, grouping: []string{"group", "topic"}, by: []string{"group", "topic"}},
		{expr: `sum(rate(projector_retries_total{reason=~"postgres|timeout", topic!="x"}[5m])) by (reason) > 1`,
			metrics: map[string][]string{"projector_retries_total": {"reason", "topic"}}, grouping: []string{"reason"}, by: []string{"reason"}},
		{expr: `projector_consumer_lag / on (group, topic) group_left (projection) kgo_buffered_fetch_records_total`,
			metrics:  map[string][]string{"projector_consumer_lag": nil, "kgo_buffered_fetch_records_total": nil},
			grouping: []string{"group", "topic", "projection"}},
		{expr: `increase(projector_fenced_batches_total[10m:1m]) > 0`,
			metrics: map[string][]string{"projector_fenced_batches_total": nil}},
		{expr: `max by (group (projector_partition_stalled)`, wantErr: true},
		{expr: `projector_partition_stalled{group="a}`, wantErr: true},
	} {
		q, err := parseQuery(tc.expr)
		if tc.wantErr {
			if err == nil {
				t.Errorf("%s: no error", tc.expr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if fmt.Sprint(q.metrics) != fmt.Sprint(tc.metrics) || !slices.Equal(q.grouping, tc.grouping) || !slices.Equal(q.by, tc.by) {
			t.Errorf("%s: metrics %v grouping %v by %v, want %v %v %v", tc.expr, q.metrics, q.grouping, q.by, tc.metrics, tc.grouping, tc.by)
		}
	}
}
