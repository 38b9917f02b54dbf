package projector_test

import (
	"encoding/hex"
	"log/slog"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// TestDeadLetterLogQuotesLongKeysBounded dead-letters a record whose
// key is 100 KB between two good events of another aggregate: the log
// line that reports it quotes a few hundred bytes of the key and says how
// long it was, rather than the whole key (in its key or in its error),
// and the good events apply.
func TestDeadLetterLogQuotesLongKeysBounded(t *testing.T) {
	f := faultSetup(t, demo.Options{}, 1)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	event := func(key string, v int64, typ string, amount int64) demo.Record {
		return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v, Type: typ, Owner: "owner " + key[:1], Amount: amount, OccurredAt: at}}
	}
	// Hex of random bytes: a key that compresses well would fit in an
	// index entry.
	rnd := make([]byte, 50_000)
	rand.New(rand.NewSource(1)).Read(rnd)
	big := event(hex.EncodeToString(rnd), 1, "AccountOpened", 0)
	raw, err := f.enc.Encode(big)
	if err != nil {
		t.Fatal(err)
	}
	big.Poison, big.Raw = "100 KB key", raw
	f.records = []demo.Record{event("a", 1, "AccountOpened", 0), big, event("a", 2, "Deposited", 10)}
	f.produce(t, f.records)

	logs := &lockedBuffer{}
	cfg := fastRetry
	run(t, f.engine(t, "quoting", projector.Config{Partition: cfg,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}))
	f.verify(t, "quoting")

	const bound = 3000
	var line string
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the dead letter's log line", func() bool {
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "records dead-lettered") {
				line = l
				return true
			}
		}
		return false
	}))
	if len(line) > bound || !strings.Contains(line, "(100000 bytes)") {
		t.Errorf("dead-letter log line of %d bytes (want at most %d, naming the key's 100000 bytes): %.600s…", len(line), bound, line)
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if len(l) > bound {
			t.Errorf("log line of %d bytes, over %d: %.300s…", len(l), bound, l)
		}
	}
}
