package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// Report is what `projector-bench` prints, as a table or as JSON.
type Report struct {
	Settings  Settings   `json:"settings"`
	Rows      []*Row     `json:"rows"`
	NotRun    []NotRun   `json:"not_run,omitempty"`
	Freshness *Freshness `json:"freshness,omitempty"`
	// FreshnessLoads holds every freshness run when there were several
	// (--fresh-load with a list), the first of them also in Freshness.
	FreshnessLoads []*Freshness `json:"freshness_loads,omitempty"`
	// RebuildFreshness is the live generation's freshness without, then
	// with, a rebuild running beside it (rebuild-freshness).
	RebuildFreshness []*Freshness `json:"rebuild_freshness,omitempty"`
	Scaling          []ScalePoint `json:"scaling,omitempty"`
	Targets          []Target     `json:"targets"`
	Failed           []string     `json:"failed,omitempty"`
}

// Settings describe the run.
type Settings struct {
	Events           int     `json:"events"`
	Aggregates       int     `json:"aggregates"`
	Distinct         int     `json:"aggregates_with_events"`
	Partitions       int     `json:"partitions"`
	Skew             string  `json:"skew"`
	Reorder          float64 `json:"reorder"`
	Duplicate        float64 `json:"duplicate,omitempty"`
	ValueBytes       float64 `json:"value_bytes_mean"`
	Runs             int     `json:"runs"`
	CPUs             int     `json:"cpus"`
	GoVersion        string  `json:"go_version"`
	Postgres         string  `json:"postgres_version"`
	Database         string  `json:"database"`
	Fsync            string  `json:"fsync"`
	SyncCommit       string  `json:"synchronous_commit"`
	SharedBuffers    string  `json:"shared_buffers"`
	Kafka            string  `json:"kafka"`
	TimeLimitSeconds float64 `json:"naive_time_limit_seconds"`
	BatchMaxRecords  int     `json:"batch_max_records"`
	BatchMaxWaitMS   float64 `json:"batch_max_wait_ms"`
	CommitMaxBatches int     `json:"commit_max_batches"`
	MemberMaxRecords int     `json:"member_max_records"` // 0: the default, negative: no bound
	StateCacheRows   int     `json:"state_cache_rows"`   // 0: the default, negative: off
	StateCacheBytes  int64   `json:"state_cache_bytes"`  // 0: the default, negative: off
	CopyConns        int     `json:"copy_connections"`
}

// Row is one line of the table.
type Row struct {
	Mode         string  `json:"mode"`
	Name         string  `json:"name"`
	Events       int64   `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// RunsEPS is every run's events/s, in the order they ran (the row is
	// their median).
	RunsEPS []float64 `json:"events_per_sec_runs,omitempty"`
	VsLimit *float64  `json:"ratio_to_limit,omitempty"`
	// VsKeyedLimit is the ratio to the keyed COPY limit (see
	// ModeLimitKeyed).
	VsKeyedLimit *float64 `json:"ratio_to_keyed_limit,omitempty"`
	// VsUpsert is the ratio to the upsert peer (ModeUpsert).
	VsUpsert     *float64 `json:"ratio_to_upsert,omitempty"`
	VsNaive      *float64 `json:"ratio_to_naive,omitempty"`
	VsWatermill  *float64 `json:"ratio_to_watermill,omitempty"`
	GoCPU        float64  `json:"go_cpu_seconds"`
	GoCPUPerEvUS float64  `json:"go_cpu_us_per_event"`
	PGCPU        *float64 `json:"pg_cpu_seconds"` // null: n/a
	PGCPUPerEvUS *float64 `json:"pg_cpu_us_per_event"`
	PGCPUNote    string   `json:"pg_cpu_note,omitempty"`
	// ParentCPU is the benchmark process's own CPU in the window: the
	// embedded broker and registry, and the harness.
	ParentCPU float64 `json:"parent_cpu_seconds"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
	// RSSQuartilesMB is the RSS at 25, 50, 75 and 100% of the window.
	RSSQuartilesMB []float64 `json:"rss_quartiles_mb,omitempty"`
	FreshP50MS     *float64  `json:"freshness_p50_ms,omitempty"`
	FreshP99MS     *float64  `json:"freshness_p99_ms,omitempty"`
	JoinSeconds    float64   `json:"join_seconds,omitempty"`
	RowWrites      int64     `json:"row_writes,omitempty"`
	// Fetched is how many records the engine read from Kafka to consume
	// Events (more: some were fetched twice).
	Fetched int64   `json:"records_fetched,omitempty"`
	Phases  *Phases `json:"batch_phases,omitempty"`
	// Prefix is set when the run stopped at the time limit: it was
	// measured on the first Events events (per partition, a prefix).
	Prefix bool   `json:"prefix"`
	Total  int    `json:"stream_events"`
	Check  string `json:"check"`
	// Mismatches counts the accounts whose row differs from the reference
	// fold, for the upsert and Kafka Connect peers, whose differences are a
	// result rather than a failed run.
	Mismatches *int `json:"reference_mismatches,omitempty"`
	// Peer says what ran, for a peer that is not this program; Note what
	// its check found beyond ok or not.
	Peer string `json:"peer,omitempty"`
	Note string `json:"note,omitempty"`
	// VsFold is the rebuild's events/s as a share of engine fold's (the
	// rebuild row); Rebuild what its run saw of the operation.
	VsFold  *float64       `json:"ratio_to_engine_fold,omitempty"`
	Rebuild *RebuildResult `json:"rebuild,omitempty"`
}

// NotRun is a row left out, and why.
type NotRun struct {
	Mode   string `json:"mode"`
	Reason string `json:"reason"`
}

// ScalePoint is the fold engine over one stream size.
type ScalePoint struct {
	Aggregates   int     `json:"aggregates"`
	Events       int     `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	RowWrites    int64   `json:"row_writes"`
	// GoCPUPerEvUS and PGCPUPerEvUS are the CPU cost of an event in the
	// consumer and in Postgres (nil: n/a).
	GoCPUPerEvUS float64  `json:"go_cpu_us_per_event"`
	PGCPUPerEvUS *float64 `json:"pg_cpu_us_per_event"`
	// CPUPerRowWriteUS is both processes' CPU per row written (nil: n/a).
	CPUPerRowWriteUS *float64 `json:"cpu_us_per_row_write"`
	Check            string   `json:"check"`
	// RunsEPS is every run's events/s, in the order they ran.
	RunsEPS []float64 `json:"events_per_sec_runs,omitempty"`
	// KeyedLimitEPS is the keyed COPY limit on this size's stream: the
	// rows per second Postgres took in under a primary key (median; 0: not
	// run). CeilingEPS is the events/s it allows at the engine's row
	// writes per event: what a consumer that cost nothing itself would
	// reach, were its row writes as cheap as COPY's keyed rows.
	KeyedLimitEPS float64 `json:"keyed_limit_rows_per_sec,omitempty"`
	CeilingEPS    float64 `json:"ceiling_events_per_sec,omitempty"`
}

// ceiling computes CeilingEPS.
func (p *ScalePoint) ceiling() {
	if p.KeyedLimitEPS > 0 && p.RowWrites > 0 {
		p.CeilingEPS = p.KeyedLimitEPS * float64(p.Events) / float64(p.RowWrites)
	}
}

// cpuPerRowWrite is the CPU, projector's and Postgres's, per row written.
func (p ScalePoint) cpuPerRowWrite() (float64, bool) {
	if p.PGCPUPerEvUS == nil || p.RowWrites <= 0 {
		return 0, false
	}
	return (p.GoCPUPerEvUS + *p.PGCPUPerEvUS) * float64(p.Events) / float64(p.RowWrites), true
}

// Target is one of the targets, met or not.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  *bool  `json:"met"` // null: not measured
}

var rowNames = map[string]string{
	ModeLimit:          "limit (COPY)",
	ModeLimitKeyed:     "keyed limit (COPY)",
	ModeEngineSnapshot: "engine snapshot",
	ModeEngineFold:     "engine fold",
	ModeRebuild:        "rebuild (unthrottled)",
	ModeUpsert:         "upsert (batch/poll)",
	ModeNaive:          "naive (tx/event)",
	ModeWatermill:      "watermill (tx/event)",
	ModeConnectJDBC:    "connect jdbc sink",
}

// peerModes are the rows whose differences from the reference fold are
// counted rather than failed, and why they differ.
var peerModes = map[string]string{
	ModeUpsert:      "no gap handling: an event behind a newer one of its account is dropped, a missing version goes unnoticed",
	ModeConnectJDBC: "no version gate: an event that arrives after a newer one of its account overwrites it",
}

func (r *Report) row(mode string) *Row {
	for _, row := range r.Rows {
		if row.Mode == mode {
			return row
		}
	}
	return nil
}

// runsEPS lists the runs' events/s in the order they ran.
func runsEPS(runs []*Sample) []float64 {
	eps := make([]float64, len(runs))
	for i, s := range runs {
		eps[i] = s.EPS()
	}
	return eps
}

// perRound gives a's events/s as a share of b's in each round of runs
// (every round runs each mode once, so that the two ran minutes apart),
// "" unless both ran more than once.
func perRound(a, b *Row) string {
	if a == nil || b == nil || len(a.RunsEPS) < 2 || len(a.RunsEPS) != len(b.RunsEPS) {
		return ""
	}
	out := make([]string, len(a.RunsEPS))
	for i := range a.RunsEPS {
		if b.RunsEPS[i] == 0 {
			return ""
		}
		out[i] = fmt.Sprintf("%.0f%%", 100*a.RunsEPS[i]/b.RunsEPS[i])
	}
	return strings.Join(out, ", ")
}

// joinEPS writes events/s figures for the text report.
func joinEPS(eps []float64) string {
	out := make([]string, len(eps))
	for i, v := range eps {
		out[i] = group(int64(math.Round(v)))
	}
	return strings.Join(out, " · ")
}

// failed returns the first reference-check failure among runs: a run that
// is not the median fails the row all the same.
func failed(runs []*Sample) error {
	for i, s := range runs {
		if s.Check != nil {
			if len(runs) == 1 {
				return s.Check
			}
			return fmt.Errorf("run %d of %d: %w", i+1, len(runs), s.Check)
		}
	}
	return nil
}

// add makes mode's row of its runs' median.
func (r *Report) add(mode string, runs []*Sample, total int) {
	s := median(runs)
	res := s.Result
	row := &Row{
		Mode: mode, Name: rowNames[mode], Events: res.Events, Seconds: res.Seconds, EventsPerSec: s.EPS(),
		GoCPU: res.CPUSeconds, PGCPU: s.PGCPU, PGCPUNote: s.PGCPUNote, ParentCPU: s.ParentCPU, PeakRSSMB: s.PeakRSSMB,
		JoinSeconds: res.JoinSeconds, RowWrites: res.RowWrites, Fetched: res.Fetched, Phases: res.Phases,
		Prefix: res.TimedOut, Total: total, Check: "ok", Peer: res.Peer, Note: res.Note, Rebuild: res.Rebuild,
	}
	if res.Events > 0 {
		row.GoCPUPerEvUS = res.CPUSeconds / float64(res.Events) * 1e6
		if s.PGCPU != nil {
			v := *s.PGCPU / float64(res.Events) * 1e6
			row.PGCPUPerEvUS = &v
		}
	}
	if n := len(s.RSSSamples); n > 0 {
		for _, q := range []float64{0.25, 0.5, 0.75, 1} {
			row.RSSQuartilesMB = append(row.RSSQuartilesMB, s.RSSSamples[max(0, int(math.Ceil(q*float64(n)))-1)])
		}
	}
	row.RunsEPS = runsEPS(runs)
	if _, ok := peerModes[mode]; ok {
		// The peer's differences from the reference fold are counted,
		// not failed: it has no gap handling or no version gate.
		// Anything else that went wrong in its check fails it like any
		// row.
		var m *mismatches
		n := 0
		if errors.As(s.Check, &m) {
			n = len(m.diffs)
			row.Check = group(int64(n)) + " differ"
		}
		row.Mismatches = &n
		for _, rs := range runs {
			rs.Check = peerFailure(rs.Check)
		}
	}
	if err := failed(runs); err != nil {
		row.Check = "FAILED: " + err.Error()
		r.Failed = append(r.Failed, fmt.Sprintf("%s: %v", row.Name, err))
	}
	r.Rows = append(r.Rows, row)
}

// peerFailure is what of a peer's check fails its row: anything but
// differences from the reference fold.
func peerFailure(err error) error {
	var m *mismatches
	if errors.As(err, &m) {
		return nil
	}
	return err
}

// scaleKeyed gives scaling point i its keyed COPY limit, the median of runs.
func (r *Report) scaleKeyed(i int, runs []*Sample) {
	p := &r.Scaling[i]
	p.KeyedLimitEPS = median(runs).EPS()
	if err := failed(runs); err != nil {
		r.Failed = append(r.Failed, fmt.Sprintf("keyed COPY limit over %d aggregates: %v", p.Aggregates, err))
	}
}

// finish computes the ratios and the targets.
func (r *Report) finish() {
	if f, row := r.Freshness, r.row(ModeEngineFold); f != nil && row != nil {
		row.FreshP50MS, row.FreshP99MS = &f.P50MS, &f.P99MS
	}
	ratio := func(a, b *Row) *float64 {
		if a == nil || b == nil || b.EventsPerSec == 0 {
			return nil
		}
		v := a.EventsPerSec / b.EventsPerSec
		return &v
	}
	limit, keyed, naive, wm := r.row(ModeLimit), r.row(ModeLimitKeyed), r.row(ModeNaive), r.row(ModeWatermill)
	upsert := r.row(ModeUpsert)
	for _, row := range r.Rows {
		row.VsLimit, row.VsNaive, row.VsWatermill = ratio(row, limit), ratio(row, naive), ratio(row, wm)
		row.VsUpsert = ratio(row, upsert)
		row.VsKeyedLimit = ratio(row, keyed)
	}
	fold := r.row(ModeEngineFold)
	met := func(ok bool) *bool { return &ok }
	target := func(name, want string, got *float64, min float64, format string, why string) {
		t := Target{Name: name, Want: want, Got: "not measured: " + why}
		if got != nil {
			t.Got = fmt.Sprintf(format, *got)
			t.Met = met(*got >= min)
		}
		r.Targets = append(r.Targets, t)
	}
	var vsLimit, vsNaive, vsWM *float64
	if fold != nil {
		vsLimit, vsNaive, vsWM = fold.VsLimit, fold.VsNaive, fold.VsWatermill
	}
	if vsLimit != nil {
		v := *vsLimit * 100
		vsLimit = &v
	}
	target("engine fold vs COPY limit", "≥ 30%", vsLimit, 30, "%.0f%%", "needs the limit and engine fold rows")
	if rounds := perRound(fold, limit); vsLimit != nil && rounds != "" {
		r.Targets[len(r.Targets)-1].Got += " (per round: " + rounds + ")"
	}
	target("engine fold vs naive", "≥ 25×", vsNaive, 25, "%.1f×", "needs the naive and engine fold rows")
	why := "needs the watermill and engine fold rows"
	for _, n := range r.NotRun {
		if n.Mode == ModeWatermill {
			why = "watermill not run"
		}
	}
	target("engine fold vs watermill", "≥ 25×", vsWM, 25, "%.1f×", why)
	rb := r.row(ModeRebuild)
	var vsFold *float64
	if rb != nil {
		rb.VsFold = ratio(rb, fold)
		if rb.VsFold != nil {
			v := *rb.VsFold * 100
			vsFold = &v
		}
	}
	why = "run projector-bench --modes engine-fold,rebuild"
	if rb != nil {
		why = "needs the engine fold row too (--modes engine-fold,rebuild)"
	}
	target("rebuild vs engine fold catch-up", "≥ 80%", vsFold, 80, "%.0f%%", why)
	if rounds := perRound(rb, fold); vsFold != nil && rounds != "" {
		r.Targets[len(r.Targets)-1].Got += " (per round: " + rounds + ")"
	}
	flat := Target{Name: "engine RSS flat over 10,000,000 events", Want: "flat",
		Got: "not measured: run projector-bench --events 10000000 --modes engine-fold"}
	if fold != nil && r.Settings.Events >= 10_000_000 && len(fold.RSSQuartilesMB) == 4 {
		q := fold.RSSQuartilesMB
		growth := q[3] / q[0]
		flat.Got = fmt.Sprintf("%.0f → %.0f → %.0f → %.0f MB at 25/50/75/100%% of the run (×%.2f)", q[0], q[1], q[2], q[3], growth)
		flat.Met = met(growth <= 1.2)
	}
	r.Targets = append(r.Targets, flat)
	for i := range r.Scaling {
		if us, ok := r.Scaling[i].cpuPerRowWrite(); ok {
			r.Scaling[i].CPUPerRowWriteUS = &us
		}
		r.Scaling[i].ceiling()
	}
	scale := Target{Name: "engine fold cost per event, most/fewest aggregates", Want: "≤ 1.5×",
		Got: "not measured: run projector-bench --aggregates 10000,100000,1000000 --modes engine-fold"}
	if n := len(r.Scaling); n > 1 && r.Scaling[0].EventsPerSec > 0 && r.Scaling[n-1].EventsPerSec > 0 {
		growth := r.Scaling[0].EventsPerSec / r.Scaling[n-1].EventsPerSec
		scale.Got = fmt.Sprintf("×%.2f (%s → %s aggregates)", growth, group(int64(r.Scaling[0].Aggregates)), group(int64(r.Scaling[n-1].Aggregates)))
		first, ok1 := r.Scaling[0].cpuPerRowWrite()
		last, ok2 := r.Scaling[n-1].cpuPerRowWrite()
		if ok1 && ok2 && first > 0 {
			scale.Got += fmt.Sprintf("; per row write ×%.2f", last/first)
		}
		if c := r.Scaling[n-1].CeilingEPS; c > 0 {
			scale.Got += fmt.Sprintf("; keyed COPY's ceiling at %s aggregates: %s events/s, ×%.2f",
				group(int64(r.Scaling[n-1].Aggregates)), group(int64(math.Round(c))), r.Scaling[0].EventsPerSec/c)
		}
		scale.Met = met(growth <= 1.5)
	}
	r.Targets = append(r.Targets, scale)
}

// JSON writes the report as indented JSON.
func (r *Report) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Table writes the report for people.
func (r *Report) Table(w io.Writer) error {
	s := r.Settings
	reordered := ""
	if s.Reorder > 0 {
		reordered = fmt.Sprintf(", %g%% of each account's events after its next", 100*s.Reorder)
	}
	if s.Duplicate > 0 {
		reordered += fmt.Sprintf(", %g%% of the events sent again after their account's next", 100*s.Duplicate)
	}
	fmt.Fprintf(w, "projector-bench: %s events over %s aggregates (%s, %s with events%s), %d partitions, Avro values of %.0f bytes on average\n",
		group(int64(s.Events)), group(int64(s.Aggregates)), s.Skew, group(int64(s.Distinct)), reordered, s.Partitions, s.ValueBytes)
	fmt.Fprintf(w, "postgres %s at %s (fsync %s, synchronous_commit %s, shared_buffers %s); kafka: %s; %d CPUs, %s; ",
		s.Postgres, s.Database, s.Fsync, s.SyncCommit, s.SharedBuffers, s.Kafka, s.CPUs, s.GoVersion)
	if s.Runs > 1 {
		fmt.Fprintf(w, "median of %d runs\n", s.Runs)
	} else {
		fmt.Fprintln(w, "1 run")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tevents\tseconds\tevents/s\t×limit\t×upsert\t×naive\t×watermill\tgo cpu s (µs/ev)\tpg cpu s (µs/ev)\tpeak rss\tfresh p50/p99\tcheck\t")
	for _, row := range r.Rows {
		ev := group(row.Events)
		if row.Prefix {
			ev += "*"
		}
		pg := "n/a"
		if row.PGCPU != nil && row.PGCPUPerEvUS != nil {
			pg = fmt.Sprintf("%.1f (%.1f)", *row.PGCPU, *row.PGCPUPerEvUS)
		}
		fresh := "-"
		if row.FreshP50MS != nil {
			fresh = fmt.Sprintf("%.0f/%.0f ms", *row.FreshP50MS, *row.FreshP99MS)
		}
		check := row.Check
		if strings.HasPrefix(check, "FAILED") {
			check = "FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%.1f (%.1f)\t%s\t%.0f MB\t%s\t%s\t\n",
			row.Name, ev, row.Seconds, group(int64(math.Round(row.EventsPerSec))), ratioText(row.VsLimit), ratioText(row.VsUpsert), ratioText(row.VsNaive), ratioText(row.VsWatermill),
			row.GoCPU, row.GoCPUPerEvUS, pg, row.PeakRSSMB, fresh, check)
	}
	for _, n := range r.NotRun {
		fmt.Fprintf(tw, "%s\tnot run: %s\t\t\t\t\t\t\t\t\t\t\t\t\n", rowNames[n.Mode], oneLine(n.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		if row.Prefix {
			fmt.Fprintf(w, "* %s: measured on the first %s of %s events (per partition a prefix, stopped at the %.0fs time limit);\n"+
				"  events/s is that prefix's rate, so the whole stream would take about %.0fs (extrapolated, not run).\n",
				row.Name, group(row.Events), group(int64(row.Total)), s.TimeLimitSeconds, float64(row.Total)/row.EventsPerSec)
		}
	}
	for _, row := range r.Rows {
		if row.PGCPU == nil && row.PGCPUNote != "" {
			fmt.Fprintf(w, "pg cpu n/a for %s: %s\n", row.Name, row.PGCPUNote)
		}
	}
	rows, bytes, dflt := s.StateCacheRows, s.StateCacheBytes, ""
	if rows == 0 && bytes == 0 {
		dflt = " (default)"
	}
	if rows == 0 {
		rows = postgres.DefaultStateCacheRows
	}
	if bytes == 0 {
		bytes = postgres.DefaultStateCacheBytes
	}
	cache := fmt.Sprintf("at most %d rows and %d MiB%s", rows, bytes>>20, dflt)
	if rows < 0 || bytes < 0 {
		cache = "off"
	}
	member := fmt.Sprint(s.MemberMaxRecords)
	switch {
	case s.MemberMaxRecords == 0:
		member = fmt.Sprintf("%d (default)", projector.DefaultMemberMaxRecords)
	case s.MemberMaxRecords < 0:
		member = "off"
	}
	fmt.Fprintf(w, "engine: batch-max-records %d, batch-max-wait %.0fms, commit-max-batches %d, member-max-records %s, state cache %s, the pool as `projector run` opens it; limit: COPY over %d connection(s) into an append-only table",
		s.BatchMaxRecords, s.BatchMaxWaitMS, s.CommitMaxBatches, member, cache, s.CopyConns)
	if keyed := r.row(ModeLimitKeyed); keyed != nil {
		fmt.Fprint(w, "; keyed limit: the same rows into a table with a primary key (account_id, version)")
		var vs []string
		for _, row := range r.Rows {
			if (row.Mode == ModeEngineSnapshot || row.Mode == ModeEngineFold) && row.VsKeyedLimit != nil {
				vs = append(vs, fmt.Sprintf("%s %s", row.Name, ratioText(row.VsKeyedLimit)))
			}
		}
		if len(vs) > 0 {
			fmt.Fprintf(w, " (%s of it)", strings.Join(vs, ", "))
		}
	}
	fmt.Fprintln(w, ".")
	if up := r.row(ModeUpsert); up != nil {
		upsertNote(w, r, up)
	}
	if cj := r.row(ModeConnectJDBC); cj != nil {
		connectNote(w, r, cj)
	}
	fmt.Fprintln(w, "cpu: the consumer's own process (each run is a child process; the embedded broker and registry are in the parent) and the Postgres backends serving its connections, within the measured window.")
	if s.Runs > 1 {
		var runs []string
		for _, row := range r.Rows {
			runs = append(runs, row.Name+" "+joinEPS(row.RunsEPS))
		}
		fmt.Fprintf(w, "runs (events/s, in the order they ran; the table gives the median): %s\n", strings.Join(runs, "; "))
	}
	for _, mode := range []string{ModeEngineSnapshot, ModeEngineFold} {
		row := r.row(mode)
		if row == nil {
			continue
		}
		fmt.Fprintf(w, "%s: %s row writes for %s events (%.2f per event); %s records fetched (%.2f per event); group join and claim %.2fs of the window",
			row.Name, group(row.RowWrites), group(row.Events), float64(row.RowWrites)/math.Max(1, float64(row.Events)),
			group(row.Fetched), float64(row.Fetched)/math.Max(1, float64(row.Events)), row.JoinSeconds)
		if q := row.RSSQuartilesMB; len(q) == 4 {
			fmt.Fprintf(w, "; rss %.0f → %.0f → %.0f → %.0f MB at 25/50/75/100%%", q[0], q[1], q[2], q[3])
		}
		parent := "the harness"
		if s.embeddedKafka() {
			parent = "embedded broker and registry"
		}
		fmt.Fprintf(w, "; cpu of the benchmark process (%s) %.1fs (%.1f µs/ev)\n",
			parent, row.ParentCPU, row.ParentCPU/math.Max(1, float64(row.Events))*1e6)
		if p := row.Phases; p != nil && p.Batches > 0 {
			total := p.Begin + p.Load + p.Plan + p.Write + p.Commit
			fmt.Fprintf(w, "  %d transactions (%.0f events each), %.1fms each: begin %.0f%%, load state %.0f%%, plan (Go) %.0f%%, write pipeline %.0f%%, commit %.0f%%\n",
				p.Batches, float64(row.Events)/float64(p.Batches), total/float64(p.Batches)*1e3,
				100*p.Begin/total, 100*p.Load/total, 100*p.Plan/total, 100*p.Write/total, 100*p.Commit/total)
		}
	}
	if f := r.Freshness; f != nil && len(r.FreshnessLoads) == 0 {
		fmt.Fprintf(w, "freshness (engine fold): %s events produced at %s events/s (target %s = %.0f%% of the fold engine's events/s) for %.1fs:\n"+
			"  record timestamp → COMMIT of its batch returned: p50 %.1fms, p90 %.1fms, p99 %.1fms, max %.1fms over %d batches; check %s\n",
			group(int64(f.Events)), group(int64(math.Round(f.ProducedRate))), group(int64(math.Round(f.TargetRate))),
			100*f.Load, f.Seconds, f.P50MS, f.P90MS, f.P99MS, f.MaxMS, f.Batches, shortCheck(f.Check))
		fmt.Fprintln(w, "  "+freshnessCPU(f, s))
	}
	if len(r.FreshnessLoads) > 0 {
		freshnessTable(w, r.FreshnessLoads, s)
	}
	if rb := r.row(ModeRebuild); rb != nil {
		rebuildNote(w, r, rb)
	}
	if len(r.RebuildFreshness) > 0 {
		rebuildFreshnessTable(w, r.RebuildFreshness, s)
	}
	if len(r.Scaling) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "scaling (engine fold):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "aggregates\tevents\tevents/s\trow writes\tgo cpu µs/ev\tpg cpu µs/ev\tcpu µs/row write\tkeyed COPY rows/s\tceiling events/s\tcheck\t")
		for _, p := range r.Scaling {
			pg, perWrite, keyed, ceiling := "n/a", "n/a", "-", "-"
			if p.PGCPUPerEvUS != nil {
				pg = fmt.Sprintf("%.1f", *p.PGCPUPerEvUS)
			}
			if us, ok := p.cpuPerRowWrite(); ok {
				perWrite = fmt.Sprintf("%.1f", us)
			}
			if p.KeyedLimitEPS > 0 {
				keyed = group(int64(math.Round(p.KeyedLimitEPS)))
			}
			if p.CeilingEPS > 0 {
				ceiling = group(int64(math.Round(p.CeilingEPS)))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t\n", group(int64(p.Aggregates)), group(int64(p.Events)),
				group(int64(math.Round(p.EventsPerSec))), group(p.RowWrites), p.GoCPUPerEvUS, pg, perWrite, keyed, ceiling, shortCheck(p.Check))
		}

		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w, "  (with fewer aggregates more of a batch's events fall on one aggregate and collapse into one row write;")
		fmt.Fprintln(w, "  ceiling: keyed COPY rows/s over row writes per event, what a consumer that cost nothing would reach")
		fmt.Fprintln(w, "  were each of its row writes as cheap as a row COPY puts under a primary key)")
		if s.Runs > 1 {
			var runs []string
			for _, p := range r.Scaling {
				runs = append(runs, group(int64(p.Aggregates))+": "+joinEPS(p.RunsEPS))
			}
			fmt.Fprintf(w, "  runs (events/s, in the order they ran): %s\n", strings.Join(runs, "; "))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "targets:")
	for _, t := range r.Targets {
		state := "not measured"
		if t.Met != nil {
			state = map[bool]string{true: "met", false: "NOT MET"}[*t.Met]
		}
		fmt.Fprintf(w, "  %-50s want %-6s got %s: %s\n", t.Name, t.Want, t.Got, state)
	}
	if len(r.Failed) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "REFERENCE CHECK FAILED:")
		for _, f := range r.Failed {
			fmt.Fprintf(w, "  %s\n", f)
		}
	} else {
		var checked, differ []string
		for _, row := range r.Rows {
			switch {
			case row.Mode == ModeLimit || row.Mode == ModeLimitKeyed:
			case row.Mismatches != nil && *row.Mismatches > 0:
				differ = append(differ, fmt.Sprintf("%s differs from it for %s accounts (%s)", row.Name, group(int64(*row.Mismatches)), peerModes[row.Mode]))
			default:
				checked = append(checked, row.Name)
			}
		}
		if n := len(r.RebuildFreshness); n > 0 {
			checked = append(checked, fmt.Sprintf("freshness beside a rebuild (%d runs)", n))
		}
		switch {
		case len(r.FreshnessLoads) > 1:
			checked = append(checked, fmt.Sprintf("freshness (%d runs)", len(r.FreshnessLoads)))
		case r.Freshness != nil:
			checked = append(checked, "freshness")
		}
		if len(checked) > 0 {
			fmt.Fprintf(w, "\nreference fold: %s equal the reference fold of what they consumed.\n", strings.Join(checked, ", "))
		}
		if len(differ) > 0 {
			fmt.Fprintf(w, "reference fold: %s.\n", strings.Join(differ, "; "))
		}
	}
	return nil
}

// upsertNote says what the upsert peer does, how its result compares with
// the reference fold, and how the engine compares with it in this run.
func upsertNote(w io.Writer, r *Report, up *Row) {
	n := 0
	if up.Mismatches != nil {
		n = *up.Mismatches
	}
	fmt.Fprintf(w, "%s: a franz-go group consumer, one multi-row upsert per poll of each account's newest event, guarded by version, then the poll's offsets committed to Kafka (at least once, no gap handling); "+
		"%s row writes for %s events (%.2f per event); %s accounts differ from the reference fold.\n",
		up.Name, group(up.RowWrites), group(up.Events), float64(up.RowWrites)/math.Max(1, float64(up.Events)), group(int64(n)))
	var vs []string
	for _, mode := range []string{ModeEngineSnapshot, ModeEngineFold} {
		row := r.row(mode)
		if row == nil || row.VsUpsert == nil {
			continue
		}
		v := fmt.Sprintf("%s %s its events/s", row.Name, ratioText(row.VsUpsert))
		// Said of what the table shows: a ratio that rounds to 1.00 is a tie.
		if *row.VsUpsert < 0.995 {
			v += " (slower)"
		}
		vs = append(vs, v)
	}
	if len(vs) > 0 {
		fmt.Fprintf(w, "  engine vs the upsert peer, in this run: %s; engine snapshot writes the same table from the same decoder, engine fold a fold the peer cannot express.\n", strings.Join(vs, ", "))
	}
}

// connectNote says what the Kafka Connect peer ran, how its table compares
// with the reference fold, and how the engine compares with it.
func connectNote(w io.Writer, r *Report, cj *Row) {
	n := 0
	if cj.Mismatches != nil {
		n = *cj.Mismatches
	}
	writes := "row writes not read"
	if cj.RowWrites > 0 {
		writes = fmt.Sprintf("%s row writes for %s events (%.2f per event)", group(cj.RowWrites), group(cj.Events), float64(cj.RowWrites)/math.Max(1, float64(cj.Events)))
	}
	fmt.Fprintf(w, "%s: %s; the same events in JSON with schemas on a topic of their own, into the snapshot table; %s; connector and tasks running %.1fs into the window; "+
		"cpu and peak rss are the worker JVM's (and its harness's); %s accounts differ from the reference fold.\n",
		cj.Name, cj.Peer, writes, cj.JoinSeconds, group(int64(n)))
	if cj.Note != "" {
		fmt.Fprintf(w, "  %s.\n", cj.Note)
	}
	var vs []string
	for _, mode := range []string{ModeEngineSnapshot, ModeEngineFold} {
		row := r.row(mode)
		if row == nil || cj.EventsPerSec == 0 {
			continue
		}
		vs = append(vs, fmt.Sprintf("%s %.2f× its events/s", row.Name, row.EventsPerSec/cj.EventsPerSec))
	}
	if len(vs) > 0 {
		fmt.Fprintf(w, "  engine vs the Connect JDBC sink, in this run: %s.\n", strings.Join(vs, ", "))
	}
}

func ratioText(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v >= 10:
		return fmt.Sprintf("%.0f×", *v)
	}
	return fmt.Sprintf("%.2f×", *v)
}

func shortCheck(c string) string {
	if strings.HasPrefix(c, "FAILED") {
		return "FAILED"
	}
	return c
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// group formats n with thousands separators.
func group(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var parts []string
	for len(s) > 3 {
		parts = append(parts, s[len(s)-3:])
		s = s[:len(s)-3]
	}
	parts = append(parts, s)
	slices.Reverse(parts)
	out := strings.Join(parts, ",")
	if neg {
		out = "-" + out
	}
	return out
}

// freshnessCPU says where the machine's CPU went during the freshness
// run: the engine, Postgres and this process, which produced the stream.
func freshnessCPU(f *Freshness, s Settings) string {
	producer := "the producer"
	if s.embeddedKafka() {
		producer = "the producer, embedded broker and registry"
	}
	pg := "Postgres n/a"
	if f.PGCPUSeconds != nil {
		pg = fmt.Sprintf("Postgres %.1fs", *f.PGCPUSeconds)
	}
	return fmt.Sprintf("cpu over the run's %.1fs (%d CPUs, %.1f CPU seconds): the engine %.1fs, %s, %s %.1fs",
		f.WindowSeconds, s.CPUs, f.WindowSeconds*float64(s.CPUs), f.GoCPUSeconds, pg, producer, f.ProducerCPUSeconds)
}

// freshnessTable prints the freshness runs at several arrival rates, one
// line each, with where the machine's CPU went in each.
func freshnessTable(w io.Writer, runs []*Freshness, s Settings) {
	producer := "producer cpu s"
	if s.embeddedKafka() {
		producer = "producer+broker cpu s"
	}
	fmt.Fprintf(w, "freshness (engine fold) by arrival rate, record timestamp → COMMIT of its batch returned (%d CPUs; the fresh column above is the first rate's):\n", s.CPUs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "load\tevents/s\tevents\tp50 ms\tp90 ms\tp99 ms\tmax ms\tbatches\tengine cpu s\tpg cpu s\t%s\tcpu s available\tcheck\t\n", producer)
	for _, f := range runs {
		pg := "n/a"
		if f.PGCPUSeconds != nil {
			pg = fmt.Sprintf("%.1f", *f.PGCPUSeconds)
		}
		fmt.Fprintf(tw, "%.0f%%\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%.1f\t%s\t%.1f\t%.1f\t%s\t\n",
			100*f.Load, group(int64(math.Round(f.ProducedRate))), group(int64(f.Events)), f.P50MS, f.P90MS, f.P99MS, f.MaxMS,
			f.Batches, f.GoCPUSeconds, pg, f.ProducerCPUSeconds, f.WindowSeconds*float64(s.CPUs), shortCheck(f.Check))
	}
	tw.Flush()
}

// embeddedKafka reports whether the broker and registry ran in the
// benchmark process (kfake), whose CPU then counts them too.
func (s Settings) embeddedKafka() bool { return strings.HasPrefix(s.Kafka, "embedded") }

// rebuildNote says what the rebuild row ran and how it compares with the
// fold engine's catch-up.
func rebuildNote(w io.Writer, r *Report, rb *Row) {
	fmt.Fprintf(w, "%s: generation 2 of accounts (the demo's projection with a column added) rebuilt from the earliest offset beside the idle live generation, "+
		"by the rebuild supervisor and engines as projector run builds them, in one process", rb.Name)
	if x := rb.Rebuild; x != nil {
		fmt.Fprintf(w, ", --rebuild-rate %s, on a pool of %d connections (a quarter of the live pool's, at least 2); the supervisor looks every %gs (--rebuild-check-every)",
			rateText(x.Rate), x.Conns, x.PollSeconds)
	}
	fmt.Fprintf(w, ";\n  %s events from running to completed in %.1fs = %s events/s", group(rb.Events), rb.Seconds, group(int64(math.Round(rb.EventsPerSec))))
	if fold := r.row(ModeEngineFold); fold != nil && rb.VsFold != nil {
		fmt.Fprintf(w, ", %.0f%% of engine fold's catch-up (%s events/s, same stream, same run)", 100**rb.VsFold, group(int64(math.Round(fold.EventsPerSec))))
	}
	if x := rb.Rebuild; x != nil && x.CaughtUpSeconds > 0 {
		fmt.Fprintf(w, "; its engine had committed the whole stream at %.1fs (%s events/s), cutting over began at %.1fs",
			x.CaughtUpSeconds, group(int64(math.Round(float64(rb.Events)/x.CaughtUpSeconds))), x.CuttingOverSeconds)
	}
	fmt.Fprintf(w, "; %s row writes (%.2f per event), %s records fetched\n", group(rb.RowWrites), float64(rb.RowWrites)/math.Max(1, float64(rb.Events)), group(rb.Fetched))
	if p := rb.Phases; p != nil && p.Batches > 0 {
		total := p.Begin + p.Load + p.Plan + p.Write + p.Commit
		fmt.Fprintf(w, "  %d transactions (%.0f events each), %.1fms each: begin %.0f%%, load state %.0f%%, plan (Go) %.0f%%, write pipeline %.0f%%, commit %.0f%%\n",
			p.Batches, float64(rb.Events)/float64(p.Batches), total/float64(p.Batches)*1e3,
			100*p.Begin/total, 100*p.Load/total, 100*p.Plan/total, 100*p.Write/total, 100*p.Commit/total)
	}
}

// rebuildFreshnessTable prints the live generation's freshness without
// and with a rebuild beside it, one row each.
func rebuildFreshnessTable(w io.Writer, runs []*Freshness, s Settings) {
	producer := "producer cpu s"
	if s.embeddedKafka() {
		producer = "producer+broker cpu s"
	}
	load := runs[0].Load
	fmt.Fprintf(w, "freshness of the live generation (engine fold) at %.0f%% of the fold engine's events/s, after a history of %s events, record timestamp → COMMIT of its batch returned:\n",
		100*load, group(int64(s.Events)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "run\tevents/s\tevents\tp50 ms\tp90 ms\tp99 ms\tmax ms\tbatches\tengine cpu s\tpg cpu s\t%s\trebuild s\trebuild records/s\tcheck\t\n", producer)
	for _, f := range runs {
		pg := "n/a"
		if f.PGCPUSeconds != nil {
			pg = fmt.Sprintf("%.1f", *f.PGCPUSeconds)
		}
		span, rb := "-", "-"
		if x := f.Rebuild; x != nil {
			span = fmt.Sprintf("%.1f", float64(x.ToNS-x.FromNS)/1e9)
			rb = group(int64(math.Round(x.RecordsPerSec)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%.1f\t%s\t%.1f\t%s\t%s\t%s\t\n",
			rebuildFreshName(f), group(int64(math.Round(f.ProducedRate))), group(int64(f.Events)), f.P50MS, f.P90MS, f.P99MS, f.MaxMS,
			f.Batches, f.GoCPUSeconds, pg, f.ProducerCPUSeconds, span, rb, shortCheck(f.Check))
	}
	tw.Flush()
	fmt.Fprintln(w, "  (with a rebuild: the events produced while it ran beside the live generation, from its first commit until it had caught up with the history")
	fmt.Fprintln(w, "  and was cancelled before its cutover, or the window ended (rebuild s), and what it applied a second then; engine cpu is the process's over the")
	fmt.Fprintln(w, "  whole window, the rebuild's engine included, as projector run runs it)")
}
