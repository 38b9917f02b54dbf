package kafkaclient

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The client repeats a warning on every retry; the log gets it once a
// minute per broker, with how often it was left out.
func TestLoggerLimitsRepeats(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	l := newLogger(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	for i := 0; i < 100; i++ {
		l.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "b1:9092", "err", "refused")
		l.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "b2:9092", "err", "refused")
		l.Log(kgo.LogLevelInfo, "connection opened", "addr", "b1:9092")
		now = now.Add(100 * time.Millisecond)
	}
	if got := strings.Count(buf.String(), "\n"); got != 2 {
		t.Fatalf("%d lines after 10s of retries, want one per broker:\n%s", got, buf.String())
	}
	now = now.Add(time.Minute)
	l.Log(kgo.LogLevelWarn, "unable to open connection to broker", "addr", "b1:9092", "err", "refused")
	out := buf.String()
	if got := strings.Count(out, "\n"); got != 3 {
		t.Fatalf("%d lines a minute later, want 3:\n%s", got, out)
	}
	if !strings.Contains(out, "repeated=99") || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "component=kafka-client") {
		t.Errorf("the repeat line does not say how often it was left out, or its level:\n%s", out)
	}
}

// A client given a logger logs through it.
func TestOptionsSetTheLogger(t *testing.T) {
	cl, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, ok := cl.OptValue(kgo.WithLogger).(*logger); !ok {
		t.Errorf("client logger %T, want the rate-limited slog adapter", cl.OptValue(kgo.WithLogger))
	}
}
