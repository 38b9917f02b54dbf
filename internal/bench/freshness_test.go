package bench

import (
	"strings"
	"testing"
	"time"
)

func TestLatencies(t *testing.T) {
	ms := int64(time.Millisecond)
	commits := []Commit{
		{Partition: 0, From: 2, To: 5, At: 50 * ms},
		{Partition: 0, From: 0, To: 2, At: 20 * ms},
		{Partition: 1, From: 0, To: 1, At: 30 * ms},
	}
	partOf := []int32{0, 0, 1, 0, 0, 0}
	offOf := []int64{0, 1, 0, 2, 3, 4}
	stamp := []int64{10 * ms, 15 * ms, 10 * ms, 30 * ms, 40 * ms, 45 * ms}
	got, err := latencies(commits, partOf, offOf, stamp)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{5, 5, 10, 10, 20, 20} // sorted
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if p := pct(got, 0.5); p != 10 {
		t.Errorf("p50 = %v, want 10", p)
	}
	if p := pct(got, 0.99); p != 20 {
		t.Errorf("p99 = %v, want 20", p)
	}
	if _, err := latencies(commits, []int32{1}, []int64{1}, []int64{0}); err == nil || !strings.Contains(err.Error(), "no commit covers") {
		t.Errorf("an offset no commit covers: err = %v", err)
	}
}

func TestGroup(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45000: "-45,000"} {
		if got := group(n); got != want {
			t.Errorf("group(%d) = %q, want %q", n, got, want)
		}
	}
}
