package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metricsql"
)

// dashboardFile is the Grafana dashboard the compose stack provisions.
var dashboardFile = filepath.Join("..", "..", "deploy", "grafana", "dashboards", "projector.json")

// dashboard is the part of a Grafana dashboard the checks read. Rows of
// the current schema hold no panels (they follow the row); a collapsed
// row holds its own.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardPanel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	GridPos    struct{ X, Y, W, H int } `json:"gridPos"`
	Datasource json.RawMessage          `json:"datasource"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// dashboardDatasource is what every panel and query must point at: the
// dashboard's data source variable, so that an imported dashboard works
// with whatever the Prometheus data source is called there.
const dashboardDatasource = `{"type":"prometheus","uid":"${datasource}"}`

// grafanaIntervals are Grafana's built-in range variables; a duration
// stands in for them so that the expression parses as Prometheus sees it.
var grafanaIntervals = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// dashboardVariable is a dashboard variable referenced outside a string
// (inside one it is only a value, e.g. job=~"$job").
var dashboardVariable = regexp.MustCompile(`\$\{?[a-zA-Z_]\w*`)

// labelValuesQuery is a variable query of Grafana's Prometheus data
// source: label_values(SELECTOR, LABEL).
var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)

// promQLFunctions are the functions the dashboard may call: PromQL's (the
// parser also knows MetricsQL's extensions, which Prometheus refuses).
var promQLFunctions = map[string]bool{
	"sum": true, "max": true, "min": true, "avg": true, "count": true, "topk": true, "bottomk": true, "quantile": true,
	"rate": true, "increase": true, "irate": true, "delta": true, "deriv": true, "max_over_time": true, "min_over_time": true,
	"avg_over_time": true, "histogram_quantile": true, "vector": true, "scalar": true, "clamp_min": true, "clamp_max": true,
	"time": true, "timestamp": true, "abs": true, "absent": true, "label_replace": true,
}

// TestDashboard holds deploy/grafana/dashboards/projector.json to the
// metrics the code registers, as TestAlertRules does the alert rules: a
// panel querying a metric or label that does not exist stays empty, and
// an empty panel looks like a quiet system. It also checks what Grafana
// needs to load the file: well-formed JSON, unique panel ids, and every
// query on the data source variable.
func TestDashboard(t *testing.T) {
	src, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(src, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s: uid %q, title %q: both are needed for provisioning", dashboardFile, d.UID, d.Title)
	}

	labels := metricLabels(codeMetrics(t))
	vars := map[string]string{} // name → type
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("%s: no variable datasource of type datasource (have %v)", dashboardFile, vars)
	}

	queries := 0
	check := func(where, expr string) {
		queries++
		if err := checkDashboardExpr(expr, labels, vars); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := "variable " + v.Name
		if string(v.Datasource) != "" && compactJSON(t, v.Datasource) != dashboardDatasource {
			t.Errorf("%s: datasource %s, want %s", where, v.Datasource, dashboardDatasource)
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("%s: query: %v", where, err)
			continue
		}
		m := labelValuesQuery.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("%s: query %q is not label_values(SELECTOR, LABEL)", where, q.Query)
			continue
		}
		check(where, m[1])
		metric := strings.TrimSpace(m[1])
		if i := strings.IndexByte(metric, '{'); i >= 0 {
			metric = metric[:i]
		}
		if have := labels[metric]; !slices.Contains(have, m[2]) && !targetLabels[m[2]] {
			t.Errorf("%s: label_values of %q, which %s does not have (it has %v)", where, m[2], metric, have)
		}
	}

	ids := map[int]string{}
	var placed []struct{ X, Y, W, H int }
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if p.ID == 0 {
				t.Errorf("%s: no id", where)
			} else if other, ok := ids[p.ID]; ok {
				t.Errorf("%s: id %d is also panel %q's", where, p.ID, other)
			}
			ids[p.ID] = p.Title
			// Grafana's grid is 24 columns wide; panels placed over one
			// another are moved, so the file would not be what one sees.
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v is not inside the 24-column grid", where, g)
			}
			for _, o := range placed {
				if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
					t.Errorf("%s: gridPos %+v overlaps another panel's %+v", where, g, o)
				}
			}
			placed = append(placed, g)
			if len(p.Targets) > 0 && compactJSON(t, p.Datasource) != dashboardDatasource {
				t.Errorf("%s: datasource %s, want %s", where, p.Datasource, dashboardDatasource)
			}
			for _, tg := range p.Targets {
				if compactJSON(t, tg.Datasource) != dashboardDatasource {
					t.Errorf("%s, query %s: datasource %s, want %s", where, tg.RefID, tg.Datasource, dashboardDatasource)
				}
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s, query %s: no expr", where, tg.RefID)
					continue
				}
				check(fmt.Sprintf("%s, query %s", where, tg.RefID), tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if queries < 20 {
		t.Errorf("%s: checked %d queries; the dashboard has more: is the file's shape what the test reads?", dashboardFile, queries)
	}
}

// metricLabels maps every metric the engine, its Kafka client and the
// relay register to its label names, and a histogram's series
// (_bucket with le, _sum, _count) to the same.
func metricLabels(m registeredMetrics) map[string][]string {
	out := map[string][]string{}
	for _, f := range slices.Concat(m.engine, m.relay, m.client) {
		var ls []string
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				ls = append(ls, l.GetName())
			}
		}
		name := f.GetName()
		out[name] = ls
		if f.GetType().String() == "HISTOGRAM" {
			out[name+"_bucket"] = append(slices.Clip(ls), "le")
			out[name+"_sum"] = ls
			out[name+"_count"] = ls
		}
	}
	out[startupRetries.name] = strings.Split(startupRetries.labels, ", ")
	return out
}

// checkDashboardExpr parses expr as PromQL, with Grafana's intervals
// replaced by a duration, and checks that every metric it selects exists
// with the labels its matchers name, that every label an aggregation or a
// binary operation groups or matches on is one the metrics below it
// have, and that it calls only PromQL's functions and names only the
// dashboard's variables.
func checkDashboardExpr(expr string, labels map[string][]string, vars map[string]string) error {
	for _, v := range dashboardVariable.FindAllString(stripStrings(expr), -1) {
		name := strings.TrimPrefix(strings.TrimPrefix(v, "$"), "{")
		if !strings.HasPrefix(name, "__") {
			return fmt.Errorf("expr %q uses $%s outside a string: only a label value may be a variable", expr, name)
		}
	}
	for _, v := range dashboardVariable.FindAllString(expr, -1) {
		name := strings.TrimPrefix(strings.TrimPrefix(v, "$"), "{")
		if _, ok := vars[name]; !ok && !strings.HasPrefix(name, "__") {
			return fmt.Errorf("expr %q uses $%s, which is not a variable of the dashboard", expr, name)
		}
	}
	e, err := metricsql.Parse(grafanaIntervals.Replace(expr))
	if err != nil {
		return fmt.Errorf("expr %q does not parse: %w", expr, err)
	}
	var problems []string
	// below is the union of the labels of the metrics under a node.
	var below func(metricsql.Expr) []string
	below = func(e metricsql.Expr) []string {
		var out []string
		metricsql.VisitAll(e, func(n metricsql.Expr) {
			if me, ok := n.(*metricsql.MetricExpr); ok {
				for _, lfs := range me.LabelFilterss {
					for _, lf := range lfs {
						if lf.Label == "__name__" {
							out = append(out, labels[lf.Value]...)
						}
					}
				}
			}
		})
		return append(out, "instance", "job")
	}
	selected := 0
	metricsql.VisitAll(e, func(n metricsql.Expr) {
		switch n := n.(type) {
		case *metricsql.MetricExpr:
			for _, lfs := range n.LabelFilterss {
				name := ""
				for _, lf := range lfs {
					if lf.Label == "__name__" && !lf.IsRegexp && !lf.IsNegative {
						name = lf.Value
					}
				}
				if name == "" {
					problems = append(problems, fmt.Sprintf("a selector without a metric name: %s", n.AppendString(nil)))
					continue
				}
				selected++
				have, ok := labels[name]
				if !ok {
					problems = append(problems, fmt.Sprintf("%s, which the code does not register (see docs/metrics.md)", name))
					continue
				}
				for _, lf := range lfs {
					if lf.Label != "__name__" && !slices.Contains(have, lf.Label) && !targetLabels[lf.Label] {
						problems = append(problems, fmt.Sprintf("label %q of %s, which has only %v", lf.Label, name, have))
					}
				}
			}
		case *metricsql.AggrFuncExpr:
			if !promQLFunctions[strings.ToLower(n.Name)] {
				problems = append(problems, fmt.Sprintf("%s(), not a PromQL function the dashboard may use", n.Name))
			}
			if n.Limit != 0 {
				problems = append(problems, "a limit clause, which is MetricsQL's, not PromQL's")
			}
			have := below(n)
			for _, l := range n.Modifier.Args {
				if !slices.Contains(have, l) {
					problems = append(problems, fmt.Sprintf("%s %s (%s): no metric under it has label %q", n.Name, n.Modifier.Op, strings.Join(n.Modifier.Args, ", "), l))
				}
			}
		case *metricsql.FuncExpr:
			if !promQLFunctions[strings.ToLower(n.Name)] {
				problems = append(problems, fmt.Sprintf("%s(), not a PromQL function the dashboard may use", n.Name))
			}
		case *metricsql.BinaryOpExpr:
			left, right := below(n.Left), below(n.Right)
			for _, l := range slices.Concat(n.GroupModifier.Args, n.JoinModifier.Args) {
				if !slices.Contains(left, l) || !slices.Contains(right, l) {
					problems = append(problems, fmt.Sprintf("%s matches on label %q, which one side's metrics lack", n.Op, l))
				}
			}
		}
	})
	if selected == 0 {
		problems = append(problems, "no metric at all")
	}
	if len(problems) > 0 {
		return fmt.Errorf("expr %q: %s", expr, strings.Join(problems, "; "))
	}
	return nil
}

// stripStrings blanks the quoted strings of a PromQL expression.
func stripStrings(expr string) string {
	var b strings.Builder
	var quote byte
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case quote != 0 && c == '\\':
			i++
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
		case c == '"' || c == '\'' || c == '`':
			quote = c
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func compactJSON(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// TestDashboardExprCheck: the dashboard check catches what would leave a
// panel empty or broken, and passes what is right.
func TestDashboardExprCheck(t *testing.T) {
	labels := map[string][]string{
		"projector_consumer_lag":                         {"group", "partition", "topic"},
		"projector_batch_commit_duration_seconds_bucket": {"group", "le"},
		"projector_outbox_pending":                       nil,
	}
	vars := map[string]string{"job": "query", "group": "query", "datasource": "datasource"}
	good := []string{
		`max by (topic, partition) (projector_consumer_lag{job=~"$job", group=~"$group"})`,
		`histogram_quantile(0.99, sum by (le) (rate(projector_batch_commit_duration_seconds_bucket{group=~"$group"}[$__rate_interval])))`,
		`count(projector_consumer_lag{group="a"} > 10) or vector(0)`,
		`max by (instance) (projector_outbox_pending)`,
	}
	for _, expr := range good {
		if err := checkDashboardExpr(expr, labels, vars); err != nil {
			t.Errorf("%v", err)
		}
	}
	bad := map[string]string{
		`max(projector_consumer_lagg)`:                                      "does not register",
		`max(projector_consumer_lag{projection="x"})`:                       `label "projection"`,
		`max by (projection) (projector_consumer_lag)`:                      `label "projection"`,
		`sum(rate(projector_consumer_lag[5m]`:                               "does not parse",
		`max(projector_consumer_lag{group=~"$nope"})`:                       "$nope",
		`max(projector_consumer_lag[$job])`:                                 "outside a string",
		`sum(projector_consumer_lag) by (topic) limit 3`:                    "MetricsQL",
		`range_median(projector_consumer_lag)`:                              "not a PromQL function",
		`projector_consumer_lag * on (projection) projector_outbox_pending`: `label "projection"`,
		`vector(1)`: "no metric",
	}
	for expr, want := range bad {
		err := checkDashboardExpr(expr, labels, vars)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one saying %q", expr, err, want)
		}
	}
}
