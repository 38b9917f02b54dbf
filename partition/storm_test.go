package partition

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// batch makes a batch of n records from offset from whose dead letters
// are those bad says (by index in the batch; "": applies).
func batch(from int64, n int, bad func(i int) string) ([]*item, []sinks.DeadLetter) {
	items := make([]*item, n)
	var dead []sinks.DeadLetter
	for i := range items {
		items[i] = &item{offset: from + int64(i)}
		if class := bad(i); class != "" {
			dead = append(dead, sinks.DeadLetter{Offset: from + int64(i), Class: class, Err: "bad record", RecordKey: []byte("k")})
		}
	}
	return items, dead
}

func every(k int, class string) func(int) string {
	return func(i int) string {
		if i%k == 0 {
			return class
		}
		return ""
	}
}

// TestStormGuardRule: the guard trips on the record that makes more than
// the share of the records in view dead letters of one class, and only
// once stormLeast of them (or the whole window) are in view.
func TestStormGuardRule(t *testing.T) {
	const decode, invalid = sinks.ClassDecode, sinks.ClassInvalid
	for _, tc := range []struct {
		name    string
		share   float64
		window  int
		batches [][2]any // records, the class of each
		trip    int64    // offset of the record that trips; -1: none
		class   string
	}{
		{"a first small batch, mostly bad", 0.5, 1000, [][2]any{{3, every(1, decode)}}, -1, ""},
		{"all bad: trips once 100 are in view", 0.5, 1000, [][2]any{{2000, every(1, decode)}}, 99, decode},
		{"all bad in batches of 3", 0.5, 1000, [][2]any{{3, every(1, invalid)}, {99, every(1, invalid)}}, 99, invalid},
		{"a small window judges when full", 0.5, 10, [][2]any{{20, every(1, decode)}}, 9, decode},
		{"1% poison pills", 0.5, 1000, [][2]any{{20000, every(100, decode)}}, -1, ""},
		{"half exactly is not more than half", 0.5, 1000, [][2]any{{4000, func(i int) string { return [...]string{"", decode}[i%2] }}}, -1, ""},
		{"two classes, neither the majority", 0.5, 1000, [][2]any{{4000, func(i int) string {
			return [...]string{decode, invalid, "", decode, invalid}[i%5]
		}}}, -1, ""},
		{"a storm after good records", 0.5, 1000, [][2]any{{1000, every(1000, "")}, {1000, every(1, sinks.ClassKeyMismatch)}}, 1500, sinks.ClassKeyMismatch},
		{"a lower share", 0.1, 1000, [][2]any{{1000, every(5, decode)}}, 100, decode},
		{"off", -1, 1000, [][2]any{{5000, every(1, decode)}}, -1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{DeadLetterStormShare: tc.share, DeadLetterStormWindow: tc.window}
			cfg.defaults()
			g := newStormGuard(cfg)
			var at int64
			var trip *stormTrip
			for _, b := range tc.batches {
				items, dead := batch(at, b[0].(int), b[1].(func(int) string))
				at += int64(len(items))
				if trip = g.add(items, dead); trip != nil {
					break
				}
				g.commit(g.pos())
			}
			switch {
			case tc.trip < 0 && trip != nil:
				t.Fatalf("tripped at offset %d: %v", trip.offset, trip)
			case tc.trip >= 0 && trip == nil:
				t.Fatalf("did not trip, want a trip at offset %d", tc.trip)
			case trip != nil && (trip.offset != tc.trip || trip.class != tc.class):
				t.Fatalf("tripped at offset %d as %s, want %d as %s", trip.offset, trip.class, tc.trip, tc.class)
			}
			if trip != nil && (!strings.Contains(trip.Error(), tc.class) || !strings.Contains(trip.Error(), "bad record")) {
				t.Errorf("trip error %q does not name the class and the sample's error", trip)
			}
		})
	}
}

// TestStormGuardForgetsWhatDidNotCommit: the outcomes of a batch that was
// not committed do not count toward the next one's, and the view holds
// the last window of committed records only.
func TestStormGuardForgetsWhatDidNotCommit(t *testing.T) {
	cfg := Config{}
	cfg.defaults()
	g := newStormGuard(cfg)
	good, _ := batch(0, 3000, every(1, ""))
	g.add(good, nil)
	g.commit(g.pos())
	if len(g.seq) > 2*cfg.DeadLetterStormWindow {
		t.Errorf("holds %d outcomes, want at most twice the window", len(g.seq))
	}
	mark := g.pos()
	bad, dead := batch(3000, 400, every(1, sinks.ClassDecode))
	if trip := g.add(bad, dead); trip != nil {
		t.Fatalf("400 of 1000 tripped: %v", trip)
	}
	g.truncate(mark) // not committed
	more, dead := batch(3000, 450, every(1, sinks.ClassDecode))
	if trip := g.add(more, dead); trip != nil {
		t.Fatalf("450 of 1000 after a batch that did not commit tripped: %v", trip)
	}
	g.commit(g.pos())
	last, dead := batch(3450, 100, every(1, sinks.ClassDecode))
	if trip := g.add(last, dead); trip == nil || trip.offset != 3500 {
		t.Fatalf("trip %v, want the 501st bad record of the last 1000 (offset 3500)", trip)
	}
}

// TestDeadLettersAreLoggedOncePerMinute: the first dead letter of a class
// is logged at once; later ones at most once a minute per class, with
// the count since the last line and a sample whose secrets are masked.
func TestDeadLettersAreLoggedOncePerMinute(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &lane{w: &Worker{now: func() time.Time { return now }}, proj: &projection.Projection{Name: "accounts", KeyField: "id"},
		log: slog.New(slog.NewJSONHandler(&out, nil))}
	dl := func(off int64, class string) sinks.DeadLetter {
		return sinks.DeadLetter{Offset: off, Class: class, RecordKey: []byte("acc-1"), Err: "decode: fetch schema from postgres://u:hunter2@db/x failed"}
	}
	type line struct {
		Class   string
		Records int
		Offset  int64
		Err     string
	}
	lines := func() []line {
		var ls []line
		for l := range bytes.Lines(out.Bytes()) {
			var x line
			if err := json.Unmarshal(l, &x); err != nil {
				t.Fatal(err)
			}
			ls = append(ls, x)
		}
		out.Reset()
		return ls
	}
	l.logDeadLetters([]sinks.DeadLetter{dl(1, sinks.ClassDecode), dl(2, sinks.ClassDecode)})
	if ls := lines(); len(ls) != 1 || ls[0].Records != 2 || ls[0].Offset != 1 || ls[0].Class != sinks.ClassDecode {
		t.Fatalf("first dead letters: %+v, want one line of 2 records with the first as the sample", ls)
	} else if strings.Contains(ls[0].Err, "hunter2") {
		t.Errorf("the sample's error shows a password: %s", ls[0].Err)
	}
	for i := range 50 { // a record a second
		now = now.Add(time.Second)
		l.logDeadLetters([]sinks.DeadLetter{dl(int64(3+i), sinks.ClassDecode)})
	}
	l.logDeadLetters([]sinks.DeadLetter{dl(60, sinks.ClassKeyMismatch)})
	if ls := lines(); len(ls) != 1 || ls[0].Class != sinks.ClassKeyMismatch {
		t.Fatalf("within the minute: %+v, want only the first key_mismatch line", ls)
	}
	now = now.Add(10 * time.Second)
	l.logDeadLetters(nil) // a transaction without dead letters says what is due
	if ls := lines(); len(ls) != 1 || ls[0].Class != sinks.ClassDecode || ls[0].Records != 50 || ls[0].Offset != 3 {
		t.Fatalf("a minute after: %+v, want one decode line of the 50 since, the first of them as the sample", ls)
	}
	now = now.Add(time.Hour)
	l.logDeadLetters(nil)
	if ls := lines(); len(ls) != 0 {
		t.Fatalf("with nothing new: %+v, want no line", ls)
	}
}
