package projector_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

// TestRecordKeyMismatch sends events whose record key is not the account
// their key field names, or that have no record key: each is
// dead-lettered (class key_mismatch, counted by that reason) and changes
// no row, neither the account it names nor the one its record key names;
// the accounts' own events keep applying, in fold and in snapshot mode.
func TestRecordKeyMismatch(t *testing.T) {
	for _, mode := range projectionModes {
		t.Run(mode, func(t *testing.T) {
			b := faultSetup(t, demo.Options{}, 1).bundle
			b.useMode(t, mode)
			ev := func(recordKey, account string, v int64, typ string, amount int64) demo.Record {
				return demo.Record{Key: recordKey, Event: demo.Event{AccountID: account, Version: v, Type: typ, Owner: "owner of " + account, Amount: amount}}
			}
			reg := prometheus.NewRegistry()
			logs := &lockedBuffer{}
			logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			run(t, b.engine(t, "keys", projector.Config{Registerer: reg, Logger: logger}))
			first := []demo.Record{
				ev("y", "y", 1, "AccountOpened", 0), ev("y", "y", 2, "Deposited", 20),
				ev("w", "w", 1, "AccountOpened", 0),
			}
			b.produce(t, first)
			b.records = append(b.records, first...)
			b.verifyMode(t, "keys", mode)

			mismatched := []demo.Record{
				ev("x", "y", 3, "Deposited", 300),  // keyed as another aggregate
				ev("", "z", 1, "AccountOpened", 0), // without a record key
				ev("y", "w", 2, "Deposited", 500),  // keyed as an aggregate that exists
				ev("y", "y", 3, "Deposited", 30),   // y's own v3 applies
			}
			for _, r := range mismatched { // a batch each
				b.produce(t, []demo.Record{r})
				b.records = append(b.records, r)
				b.verifyMode(t, "keys", mode)
			}

			want := map[string][]string{"x": {sinks.ClassKeyMismatch}, "": {sinks.ClassKeyMismatch}, "y": {sinks.ClassKeyMismatch}}
			if got := deadLetterClasses(t, b.db.Pool); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("dead letters by record key and class: %v, want %v", got, want)
			}
			var counted float64
			for _, m := range metrics(t, reg, "projector_dead_letters_total") {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == sinks.ClassKeyMismatch {
						counted += m.GetCounter().GetValue()
					}
				}
			}
			if counted != 3 {
				t.Errorf("projector_dead_letters_total{reason=%q} = %v, want 3", sinks.ClassKeyMismatch, counted)
			}
			// Said once, not once per batch or record.
			if n := strings.Count(logs.String(), `"class":"key_mismatch"`); n != 1 {
				t.Errorf("%d warnings of key_mismatch dead letters, want 1:\n%s", n, logs)
			}
		})
	}
}

// lockedBuffer is a buffer the engine's goroutines may log to at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
