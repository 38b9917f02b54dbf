package bench

import (
	"bytes"
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
