package projection_test

import (
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/projection"
)

// TestParseTombstoneRetention: tombstone_retention takes a duration, whole
// days or off (kept forever), left out it is the engine's (0), and 0, a
// negative duration or anything else is refused naming the key.
func TestParseTombstoneRetention(t *testing.T) {
	for _, tc := range []struct {
		value string // "" leaves the key out
		want  time.Duration
		bad   bool
	}{
		{"", 0, false},
		{"72h", 72 * time.Hour, false},
		{"30d", 30 * 24 * time.Hour, false},
		{"off", -1, false},
		{"OFF", -1, false},
		{"0", 0, true},
		{"0d", 0, true},
		{"-1h", 0, true},
		{"a week", 0, true},
	} {
		src := baseYAML
		if tc.value != "" {
			src = edit(t, baseYAML, "    mode: fold\n", "    mode: fold\n    tombstone_retention: "+tc.value+"\n")
		}
		ps, err := projection.Parse([]byte(src), ".")
		switch {
		case tc.bad:
			if err == nil || !strings.Contains(err.Error(), "tombstone_retention") || !strings.Contains(err.Error(), "off") {
				t.Errorf("%q: %v, want a refusal naming tombstone_retention and off", tc.value, err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.value, err)
		case ps[0].TombstoneRetention != tc.want:
			t.Errorf("%q: %v, want %v", tc.value, ps[0].TombstoneRetention, tc.want)
		}
	}
	for d, want := range map[time.Duration]string{-1: "off", 7 * 24 * time.Hour: "7d", 36 * time.Hour: "36h0m0s", 90 * time.Minute: "1h30m0s"} {
		if got := projection.FormatRetention(d); got != want {
			t.Errorf("FormatRetention(%v) = %q, want %q", d, got, want)
		}
		if back, err := projection.ParseRetention(want); err != nil || back != d {
			t.Errorf("ParseRetention(%q) = %v, %v; want %v", want, back, err, d)
		}
	}
}
