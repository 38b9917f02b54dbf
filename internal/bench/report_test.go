package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// The scaling target compares the cost per event of the fewest and the
// most aggregates, and says what a row write costs at each, which differs
// from the cost per event by how many events collapse into one write.
func TestScalingTarget(t *testing.T) {
	pg := func(v float64) *float64 { return &v }
	r := &Report{Scaling: []ScalePoint{
		{Aggregates: 10_000, Events: 1000, EventsPerSec: 200, RowWrites: 500, GoCPUPerEvUS: 5, PGCPUPerEvUS: pg(5), Check: "ok"},
		{Aggregates: 1_000_000, Events: 1000, EventsPerSec: 100, RowWrites: 1000, GoCPUPerEvUS: 10, PGCPUPerEvUS: pg(12), Check: "ok"},
	}}
	r.finish()
	var scale *Target
	for i := range r.Targets {
		if strings.HasPrefix(r.Targets[i].Name, "engine fold cost per event") {
			scale = &r.Targets[i]
		}
	}
	if scale == nil || scale.Met == nil || *scale.Met {
		t.Fatalf("scaling target %+v, want measured and not met (×2.00)", scale)
	}
	// 10 µs per event over 0.5 writes per event, 22 over 1: 20 → 22 µs.
	if want := "×2.00 (10,000 → 1,000,000 aggregates); per row write ×1.10"; scale.Got != want {
		t.Errorf("got %q, want %q", scale.Got, want)
	}
	if p := r.Scaling[1].CPUPerRowWriteUS; p == nil || *p != 22 {
		t.Errorf("JSON cpu per row write of the largest size: %v, want 22", p)
	}
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "cpu µs/row write") || !strings.Contains(out.String(), "20.0") || !strings.Contains(out.String(), "22.0") {
		t.Errorf("scaling table lacks the cost per row write:\n%s", out.String())
	}
}

// Each size's keyed COPY limit bounds the engine at that size: a largest
// size whose bound is more than the target's factor below the smallest
// size's events/s cannot meet it on this machine, and the target says so.
// A keyed COPY run that loses rows fails the report.
func TestScalingCeiling(t *testing.T) {
	pg := func(v float64) *float64 { return &v }
	r := &Report{Scaling: []ScalePoint{
		{Aggregates: 10_000, Events: 1000, EventsPerSec: 900, RowWrites: 20, GoCPUPerEvUS: 2, PGCPUPerEvUS: pg(0.2), Check: "ok"},
		{Aggregates: 1_000_000, Events: 1000, EventsPerSec: 150, RowWrites: 800, GoCPUPerEvUS: 5, PGCPUPerEvUS: pg(5), Check: "ok"},
	}}
	keyed := func(seconds ...float64) []*Sample {
		var out []*Sample
		for _, s := range seconds {
			out = append(out, &Sample{Mode: ModeLimitKeyed, Result: WorkerResult{Events: 1000, Seconds: s}})
		}
		return out
	}
	r.scaleKeyed(0, keyed(2, 2.5, 5)) // 400 rows/s, the median
	r.scaleKeyed(1, keyed(4, 2.5, 2)) // 400 rows/s: 500 events/s at 0.8 writes per event
	r.finish()
	if c := r.Scaling[1].CeilingEPS; c != 500 {
		t.Errorf("ceiling of the largest size %v events/s, want 500", c)
	}
	if c := r.Scaling[0].CeilingEPS; c != 20_000 {
		t.Errorf("ceiling of the smallest size %v events/s, want 20,000", c)
	}
	scale := r.Targets[len(r.Targets)-1]
	if want := "; keyed COPY's ceiling at 1,000,000 aggregates: 500 events/s, ×1.80"; !strings.HasSuffix(scale.Got, want) || scale.Met == nil || *scale.Met {
		t.Errorf("scaling target got %q (met %v), want it to end in %q and not be met", scale.Got, scale.Met, want)
	}
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"keyed COPY rows/s", "ceiling events/s", "20,000", " 500 "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("scaling table lacks %q:\n%s", want, out.String())
		}
	}

	bad := keyed(1)
	bad[0].Check = errors.New("limit_rows holds 999 rows, want 1000")
	r.scaleKeyed(1, bad)
	if len(r.Failed) != 1 || !strings.Contains(r.Failed[0], "keyed COPY limit over 1000000 aggregates: limit_rows holds 999 rows") {
		t.Errorf("failed %q, want the keyed COPY run's lost rows", r.Failed)
	}
}

// A run that fails the reference check fails its row even when another run
// is the median, and the report lists every run's events/s.
func TestAnyFailedRunFailsTheRow(t *testing.T) {
	run := func(events int64, seconds float64, check error) *Sample {
		return &Sample{Mode: ModeEngineFold, Result: WorkerResult{Events: events, Seconds: seconds}, Check: check}
	}
	r := &Report{Settings: Settings{Runs: 3, Events: 1000}}
	r.add(ModeEngineFold, []*Sample{run(1000, 1, nil), run(1000, 2, errors.New("3 rows differ")), run(1000, 0.5, nil)}, 1000)
	r.finish()
	row := r.row(ModeEngineFold)
	if row.EventsPerSec != 1000 || !strings.Contains(row.Check, "run 2 of 3: 3 rows differ") || len(r.Failed) != 1 {
		t.Errorf("row %v events/s, check %q, failed %v; want the median 1000 and run 2's failure", row.EventsPerSec, row.Check, r.Failed)
	}
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	if want := "engine fold 1,000 · 500 · 2,000"; !strings.Contains(out.String(), want) {
		t.Errorf("report lacks the runs %q:\n%s", want, out.String())
	}
}

// The keyed COPY limit gets its row, is compared with the engine rows, and
// leaves the target, measured against the unkeyed limit, as it was.
func TestKeyedLimit(t *testing.T) {
	run := func(mode string, seconds float64) []*Sample {
		return []*Sample{{Mode: mode, Result: WorkerResult{Events: 1000, Seconds: seconds}}}
	}
	r := &Report{Settings: Settings{Runs: 1, Events: 1000}}
	r.add(ModeLimit, run(ModeLimit, 1), 1000)
	r.add(ModeLimitKeyed, run(ModeLimitKeyed, 5), 1000)
	r.add(ModeEngineFold, run(ModeEngineFold, 4), 1000)
	r.finish()
	fold := r.row(ModeEngineFold)
	if fold.VsKeyedLimit == nil || *fold.VsKeyedLimit != 1.25 || fold.VsLimit == nil || *fold.VsLimit != 0.25 {
		t.Fatalf("engine fold vs keyed limit %v, vs limit %v; want 1.25 and 0.25", fold.VsKeyedLimit, fold.VsLimit)
	}
	if got := r.Targets[0].Got; got != "25%" {
		t.Errorf("COPY target got %q, want 25%% (of the unkeyed limit)", got)
	}
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"keyed limit (COPY)", "(engine fold 1.25× of it)", "reference fold: engine fold equal"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// With several runs the COPY target also gives the ratio of each round,
// whose runs ran minutes apart, beside the ratio of the medians.
func TestCopyTargetPerRound(t *testing.T) {
	runs := func(mode string, seconds ...float64) []*Sample {
		var out []*Sample
		for _, s := range seconds {
			out = append(out, &Sample{Mode: mode, Result: WorkerResult{Events: 1000, Seconds: s}})
		}
		return out
	}
	r := &Report{Settings: Settings{Runs: 3, Events: 1000}}
	r.add(ModeLimit, runs(ModeLimit, 1, 1, 2), 1000)
	r.add(ModeEngineFold, runs(ModeEngineFold, 4, 2, 4), 1000)
	r.finish()
	if got, want := r.Targets[0].Got, "25% (per round: 25%, 50%, 50%)"; got != want {
		t.Errorf("COPY target got %q, want %q", got, want)
	}
}

// The freshness run says where the machine's CPU went while it ran, the
// producer's share included, in the table and in the JSON.
func TestFreshnessCPU(t *testing.T) {
	pg := 3.5
	r := &Report{Settings: Settings{Runs: 1, Events: 1000, CPUs: 2, Kafka: "embedded kfake (in the parent process)"}}
	r.add(ModeEngineFold, []*Sample{{Mode: ModeEngineFold, Result: WorkerResult{Events: 1000, Seconds: 1}}}, 1000)
	r.Freshness = &Freshness{Load: 0.25, TargetRate: 250, ProducedRate: 250, Events: 2500, Seconds: 10, Batches: 40, Check: "ok",
		GoCPUSeconds: 6.25, PGCPUSeconds: &pg, ProducerCPUSeconds: 4.75, WindowSeconds: 10.5}
	r.finish()
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	want := "cpu over the run's 10.5s (2 CPUs, 21.0 CPU seconds): the engine 6.2s, Postgres 3.5s, the producer, embedded broker and registry 4.8s"
	if !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	if err := r.JSON(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"pg_cpu_seconds": 3.5`, `"producer_cpu_seconds": 4.75`, `"window_seconds": 10.5`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("JSON lacks %s:\n%s", want, out.String())
		}
	}
}

// Freshness runs at several arrival rates are a table, a line per rate,
// and a list in the JSON; the first is also the table's freshness column.
func TestFreshnessLoads(t *testing.T) {
	pg := 1.5
	r := &Report{Settings: Settings{Runs: 1, Events: 1000, CPUs: 2, Kafka: "embedded kfake (in the parent process)"}}
	r.add(ModeEngineFold, []*Sample{{Mode: ModeEngineFold, Result: WorkerResult{Events: 1000, Seconds: 1}}}, 1000)
	low := &Freshness{Load: 0.1, TargetRate: 100, ProducedRate: 100, Events: 1000, Seconds: 10, P50MS: 40, P90MS: 60, P99MS: 90, MaxMS: 120,
		Batches: 30, GoCPUSeconds: 2, PGCPUSeconds: &pg, ProducerCPUSeconds: 1, WindowSeconds: 10.5, Check: "ok"}
	high := &Freshness{Load: 0.5, TargetRate: 500, ProducedRate: 499, Events: 5000, Seconds: 10, P50MS: 400, P90MS: 600, P99MS: 900, MaxMS: 1200,
		Batches: 20, GoCPUSeconds: 8, ProducerCPUSeconds: 3, WindowSeconds: 11, Check: "FAILED: rows differ"}
	r.Freshness, r.FreshnessLoads = low, []*Freshness{low, high}
	r.finish()
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"freshness (engine fold) by arrival rate",
		"10%  100  1,000  40.0  60.0  90.0  120.0  30  2.0  1.5  1.0  21.0  ok",
		"50%  499  5,000  400.0  600.0  900.0  1200.0  20  8.0  n/a  3.0  22.0  FAILED",
		"40/90 ms",
	} {
		if !strings.Contains(strings.Join(strings.Fields(text), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "freshness (engine fold): ") {
		t.Errorf("several freshness runs also printed as one:\n%s", text)
	}
	out.Reset()
	if err := r.JSON(&out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Freshness      *Freshness   `json:"freshness"`
		FreshnessLoads []*Freshness `json:"freshness_loads"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Freshness == nil || got.Freshness.Load != 0.1 || len(got.FreshnessLoads) != 2 || got.FreshnessLoads[1].Load != 0.5 {
		t.Errorf("JSON freshness %+v, loads %+v; want the 10%% run and both runs", got.Freshness, got.FreshnessLoads)
	}
}

// The rebuild row is reported as a share of engine fold's catch-up in the
// same run, per round too, against the 80% target; without the fold row
// the target says which modes measure it.
func TestRebuildTarget(t *testing.T) {
	sample := func(mode string, seconds float64) *Sample {
		return &Sample{Mode: mode, Result: WorkerResult{Events: 1000, Seconds: seconds,
			Rebuild: &RebuildResult{Conns: 2, PollSeconds: 1, CaughtUpSeconds: seconds - 0.5, CuttingOverSeconds: seconds - 0.2}}}
	}
	r := &Report{}
	r.add(ModeEngineFold, []*Sample{sample(ModeEngineFold, 1), sample(ModeEngineFold, 1)}, 1000)
	r.add(ModeRebuild, []*Sample{sample(ModeRebuild, 1.25), sample(ModeRebuild, 1.6)}, 1000)
	r.finish()
	var got *Target
	for i := range r.Targets {
		if r.Targets[i].Name == "rebuild vs engine fold catch-up" {
			got = &r.Targets[i]
		}
	}
	// Medians of 1000/1s and of 800, 625 events/s: the lower middle, 625.
	if got == nil || got.Met == nil || *got.Met || got.Got != "62% (per round: 80%, 62%)" {
		t.Fatalf("rebuild target %+v, want 62%% (per round: 80%%, 62%%), not met", got)
	}
	if v := r.row(ModeRebuild).VsFold; v == nil || *v != 0.625 {
		t.Errorf("JSON ratio to engine fold: %v, want 0.625", v)
	}
	var out bytes.Buffer
	if err := r.Table(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rebuild (unthrottled)", "62% of engine fold's catch-up", "--rebuild-rate 0 (no limit), on a pool of 2 connections"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}

	alone := &Report{}
	alone.add(ModeRebuild, []*Sample{sample(ModeRebuild, 1)}, 1000)
	alone.finish()
	var last Target
	for _, tg := range alone.Targets {
		if tg.Name == "rebuild vs engine fold catch-up" {
			last = tg
		}
	}
	if last.Met != nil || !strings.Contains(last.Got, "--modes engine-fold,rebuild") {
		t.Errorf("rebuild without engine fold: target %+v, want not measured, naming the modes", last)
	}
}
