package kafkaclient

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// logEvery is how often one client message is logged at most: a broker
// that is down makes the client repeat the same warning on every retry.
const logEvery = time.Minute

// logger hands the client's warnings and errors to slog, each distinct
// message at most once per logEvery, with the number left out since.
type logger struct {
	log *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	seen map[string]*seenMsg
}

type seenMsg struct {
	last       time.Time
	suppressed int
}

// newLogger returns the kgo.Logger of c.Logger.
func newLogger(l *slog.Logger, now func() time.Time) *logger {
	if now == nil {
		now = time.Now
	}
	return &logger{log: l.With("component", "kafka-client"), now: now, seen: make(map[string]*seenMsg)}
}

// Level is warn: the client's info lines (every connection, every
// metadata refresh) are its own business.
func (l *logger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l *logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	var lvl slog.Level
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	default:
		return
	}
	key := level.String() + "\x00" + msg + "\x00" + brokerOf(keyvals)
	now := l.now()
	l.mu.Lock()
	s := l.seen[key]
	if s != nil && now.Sub(s.last) < logEvery {
		s.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := 0
	if s == nil {
		s = &seenMsg{}
		l.seen[key] = s
	} else {
		suppressed = s.suppressed
	}
	s.last, s.suppressed = now, 0
	l.mu.Unlock()
	attrs := append([]any(nil), keyvals...)
	if suppressed > 0 {
		attrs = append(attrs, "repeated", suppressed)
	}
	l.log.Log(context.Background(), lvl, msg, attrs...)
}

// brokerOf is the broker a message is about, so that one broker's outage
// does not hide another's.
func brokerOf(keyvals []any) string {
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, ok := keyvals[i].(string); ok && (k == "broker" || k == "addr") {
			return fmt.Sprint(keyvals[i+1])
		}
	}
	return ""
}
