package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/testenv"
)

// TestBenchSmoke runs `projector-bench` on a small stream: every row must
// be there and every reference-fold check must pass. No timing is
// asserted. The benchmark's children are this test binary, started through
// TestMain like the crash test's.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several child processes")
	}
	spawnTestChildren(t)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := Main(ctx, []string{"--events", "20000", "--aggregates", "2000", "--batch-max-records", "1000",
		"--database-url", testenv.DatabaseURL(), "--time-limit", "4s", "--fresh-for", "2s", "--fresh-load", "10%,0.25"}, &stdout, &stderr)
	out := stdout.String()
	if err != nil {
		t.Fatalf("projector-bench: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	for _, row := range []string{"limit (COPY)", "keyed limit (COPY)", "engine snapshot", "engine fold", "upsert (batch/poll)", "naive (tx/event)", "watermill (tx/event)"} {
		line := lineWith(out, row)
		if line == "" {
			t.Errorf("no %q row in the table:\n%s", row, out)
			continue
		}
		if strings.Contains(line, "not run") {
			t.Errorf("%s was not run: %s", row, line)
		}
		if !strings.HasSuffix(strings.TrimSpace(line), "ok") {
			t.Errorf("%s: check did not pass: %s", row, line)
		}
	}
	// A freshness run per arrival rate asked for, each checked, with the
	// CPU the engine, Postgres and the producer took.
	if !strings.Contains(out, "freshness (engine fold) by arrival rate") {
		t.Errorf("no freshness table in:\n%s", out)
	}
	fresh := regexp.MustCompile(`(?m)^ +(10|25)%( +[0-9,.]+){6} +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +ok *$`)
	if got := fresh.FindAllString(out, -1); len(got) != 2 {
		t.Errorf("want a passed freshness run at 10%% and at 25%%, got %q in:\n%s", got, out)
	}
	want := "reference fold: engine snapshot, engine fold, upsert (batch/poll), naive (tx/event), watermill (tx/event), freshness (2 runs) equal the reference fold"
	if !strings.Contains(out, want) {
		t.Errorf("missing %q in:\n%s", want, out)
	}
	if strings.Contains(out, "FAILED") {
		t.Errorf("a check failed:\n%s", out)
	}
	// The engine's ratio to the upsert peer, in the same run.
	if !strings.Contains(out, "engine vs the upsert peer, in this run: engine snapshot ") {
		t.Errorf("no ratio of the engine to the upsert peer in:\n%s", out)
	}
	// Each partition's ~1,700 events take at least two batches of at most
	// 1,000 (as asked above), which one transaction may cover: an
	// aggregate's row is written once or twice, not once per event.
	var aggregates, writes int
	if _, err := fmt.Sscanf(strings.ReplaceAll(after(out, "(uniform, "), ",", ""), "%d", &aggregates); err != nil {
		t.Errorf("no aggregate count in %q: %v", lineWith(out, "projector-bench:"), err)
	}
	if _, err := fmt.Sscanf(strings.ReplaceAll(after(out, "engine fold: "), ",", ""), "%d row writes", &writes); err != nil {
		t.Errorf("no row writes in %q: %v", lineWith(out, "engine fold: "), err)
	}
	if writes < aggregates || writes > 2*aggregates {
		t.Errorf("engine fold wrote %d rows for 20,000 events of %d aggregates, want one or two per aggregate", writes, aggregates)
	}
	// Every event consumed was fetched; the count shows refetching.
	var fetched int
	if _, err := fmt.Sscanf(strings.ReplaceAll(after(after(out, "engine fold: "), "per event); "), ",", ""), "%d records fetched", &fetched); err != nil {
		t.Errorf("no records fetched in %q: %v", lineWith(out, "engine fold: "), err)
	}
	if fetched < 20000 {
		t.Errorf("engine fold reports %d records fetched for 20,000 events consumed", fetched)
	}
	t.Log("\n" + out)

	// Scaling: every size is run (twice, in rounds) and checked.
	stdout.Reset()
	err = Main(ctx, []string{"--events", "5000", "--aggregates", "500,2000,4000", "--modes", "engine-fold", "--runs", "2",
		"--database-url", testenv.DatabaseURL()}, &stdout, &stderr)
	out = stdout.String()
	if err != nil {
		t.Fatalf("projector-bench, scaling: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	for _, size := range []string{"500", "2,000", "4,000"} {
		line := lineWith(after(out, "scaling (engine fold):"), size+" ")
		if !strings.HasSuffix(strings.TrimSpace(line), "ok") {
			t.Errorf("scaling row of %s aggregates missing or not checked: %q\n%s", size, line, out)
		}
	}
	if got := strings.Count(stderr.String(), "run 2/2: scaling"); got != 2 {
		t.Errorf("%d second-round scaling runs logged, want 2 (the sizes after the first, in rounds):\n%s", got, stderr.String())
	}
	// Every size's stream also went through the keyed COPY limit, in every
	// round, which gives each size its ceiling.
	if got := strings.Count(stderr.String(), "keyed COPY limit, "); got != 6 {
		t.Errorf("%d keyed COPY runs logged, want 6 (3 sizes, 2 rounds):\n%s", got, stderr.String())
	}
	if !strings.Contains(lineWith(out, "engine fold cost per event"), "keyed COPY's ceiling at 4,000 aggregates: ") {
		t.Errorf("the scaling target gives no ceiling:\n%s", out)
	}

	// Hot aggregates: most events belong to a few accounts, whose events
	// in a batch collapse into one row write each (uniform, above, writes
	// about half as many rows as events; without the collapse this
	// stream would write nearly one per event).
	stdout.Reset()
	err = Main(ctx, []string{"--events", "20000", "--aggregates", "2000", "--skew", "zipf", "--modes", "engine-fold",
		"--batch-max-records", "1000", "--database-url", testenv.DatabaseURL()}, &stdout, &stderr)
	out = stdout.String()
	if err != nil {
		t.Fatalf("projector-bench, zipf: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	if line := lineWith(out, "engine fold"); !strings.HasSuffix(strings.TrimSpace(line), "ok") {
		t.Errorf("zipf: engine fold missing or not checked: %q\n%s", line, out)
	}
	writes = 0
	if _, err := fmt.Sscanf(strings.ReplaceAll(after(out, "engine fold: "), ",", ""), "%d row writes", &writes); err != nil {
		t.Errorf("zipf: no row writes in %q: %v", lineWith(out, "engine fold: "), err)
	}
	if writes <= 0 || writes > 20000/4 {
		t.Errorf("zipf: engine fold wrote %d rows for 20,000 events, want under a quarter as many:\n%s", writes, out)
	}
	t.Logf("zipf: %d row writes for 20,000 events", writes)

	// Out of order: a tenth of each account's events arrive after their
	// next one, which the engine parks until the gap fills; the tables
	// end equal to the reference fold, nothing left parked.
	stdout.Reset()
	err = Main(ctx, []string{"--events", "20000", "--aggregates", "2000", "--reorder", "0.1",
		"--modes", "engine-snapshot,engine-fold,upsert", "--batch-max-records", "1000", "--database-url", testenv.DatabaseURL()}, &stdout, &stderr)
	out = stdout.String()
	if err != nil {
		t.Fatalf("projector-bench, reorder: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	if !strings.Contains(out, "10% of each account's events after its next") {
		t.Errorf("reorder: the header does not say the stream is reordered:\n%s", out)
	}
	for _, row := range []string{"engine snapshot", "engine fold"} {
		if line := lineWith(out, row); !strings.HasSuffix(strings.TrimSpace(line), "ok") {
			t.Errorf("reorder: %s missing or not checked: %q\n%s", row, line, out)
		}
	}
	// The upsert peer takes the reordered stream too; its version guard
	// drops an event behind a newer one, which every account's last event
	// survives: the count of accounts that differ is reported, not hidden.
	if !strings.Contains(out, "upsert (batch/poll): a franz-go group consumer") || !strings.Contains(out, " accounts differ from the reference fold") {
		t.Errorf("reorder: the upsert peer's mismatch count is not reported:\n%s", out)
	}
	// The transaction-per-event consumers cannot take a reordered stream.
	err = Main(ctx, []string{"--events", "1000", "--reorder", "0.1", "--modes", "engine-fold,naive",
		"--database-url", testenv.DatabaseURL()}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--reorder") || !strings.Contains(err.Error(), "naive") {
		t.Errorf("reorder with the naive consumer: %v, want a refusal naming --reorder and naive", err)
	}
}

// TestBenchRebuildSmoke runs the rebuild modes on a small stream: the
// rebuild cuts over and its view equals the reference fold under the new
// definition, its events/s is given as a share of engine fold's, and the
// live generation's freshness is measured without and with a rebuild
// beside it (throttled so that it runs through the window), each checked.
func TestBenchRebuildSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several child processes")
	}
	spawnTestChildren(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := Main(ctx, []string{"--events", "20000", "--aggregates", "2000", "--batch-max-records", "1000",
		"--modes", "engine-fold,rebuild,rebuild-freshness", "--rebuild-rate", "2000", "--fresh-for", "2s",
		"--database-url", testenv.DatabaseURL()}, &stdout, &stderr)
	out := stdout.String()
	if err != nil {
		t.Fatalf("projector-bench: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	for _, row := range []string{"engine fold", "rebuild (unthrottled)", "without a rebuild", "with a rebuild (--rebuild-rate 2,000)"} {
		if line := lineWith(out, row); !strings.HasSuffix(strings.TrimSpace(line), "ok") {
			t.Errorf("%s: missing or not checked: %q\n%s", row, line, out)
		}
	}
	if !regexp.MustCompile(`rebuild vs engine fold catch-up +want ≥ 80% +got [0-9]+%`).MatchString(out) {
		t.Errorf("no measured rebuild target in:\n%s", out)
	}
	if !strings.Contains(out, "% of engine fold's catch-up (") {
		t.Errorf("the rebuild is not given next to engine fold's catch-up:\n%s", out)
	}
	// The rebuild applied records through the second window.
	var rate int
	with := strings.Fields(lineWith(out, "with a rebuild (--rebuild-rate 2,000)"))
	if len(with) < 2 {
		t.Fatalf("no rebuild-freshness row with a rebuild:\n%s", out)
	}
	if _, err := fmt.Sscanf(strings.ReplaceAll(with[len(with)-2], ",", ""), "%d", &rate); err != nil || rate <= 0 {
		t.Errorf("rebuild records/s %q (%v), want the rebuild applying records through the window", with[len(with)-2], err)
	}
	want := "reference fold: engine fold, rebuild (unthrottled), freshness beside a rebuild (2 runs) equal the reference fold"
	if !strings.Contains(out, want) {
		t.Errorf("missing %q in:\n%s", want, out)
	}
	t.Log("\n" + out)
}

// after returns what follows the first occurrence of marker in s.
func after(s, marker string) string {
	if i := strings.Index(s, marker); i >= 0 {
		return s[i+len(marker):]
	}
	return ""
}

func lineWith(s, prefix string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), prefix) {
			return line
		}
	}
	return ""
}
