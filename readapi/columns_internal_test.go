package readapi

import (
	"encoding/json"
	"testing"
)

// appendString's copy of plain strings writes what encoding/json writes.
func TestAppendStringAsJSON(t *testing.T) {
	for _, s := range []string{"", "open", "k42", "a b", `q"uote`, `back\slash`, "<a>&", "tab\t", "\x7f", "é", "\u2028", "\xff", "line\n"} {
		want, _ := json.Marshal(s)
		if got := appendString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got[1:], want)
		}
	}
}
