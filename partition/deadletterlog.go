package partition

import (
	"time"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/sinks"
)

// Dead letters are heard in the log, without a line per record: a
// partition logs the first of a class at once, then at most one line per
// class every deadLetterLogEvery, with how many were dead-lettered since
// the last line and one of them as a sample. Only committed dead letters
// are logged.

// deadLetterLogEvery is how often a partition logs a class's dead
// letters again.
const deadLetterLogEvery = time.Minute

// deadLetterHints say what to do about a class, where one line can.
var deadLetterHints = map[string]string{
	sinks.ClassKeyMismatch: "the producer must key each record by its aggregate id",
	sinks.ClassDecode:      "the record is not in the Confluent wire format, or its schema id is not in the registry",
}

// classLog is what a partition has to say of one class's dead letters.
type classLog struct {
	logged time.Time // the last line; zero: none yet
	count  int       // dead-lettered since
	// The sample: the first of them.
	offset int64
	key    string
	err    string
}

// logDeadLetters counts the committed dead letters of a transaction and
// logs each class that is due.
func (l *lane) logDeadLetters(dead []sinks.DeadLetter) {
	if len(dead) == 0 && len(l.deadLog) == 0 {
		return
	}
	for i := range dead {
		d := &dead[i]
		c := l.deadLog[d.Class]
		if c == nil {
			if l.deadLog == nil {
				l.deadLog = map[string]*classLog{}
			}
			c = &classLog{}
			l.deadLog[d.Class] = c
		}
		if c.count == 0 {
			c.offset, c.key, c.err = d.Offset, clip(string(d.RecordKey)), redact.ClipTo(d.Err, 4*redact.MaxQuoted)
		}
		c.count++
	}
	now := l.w.now()
	for class, c := range l.deadLog {
		if c.count == 0 || (!c.logged.IsZero() && now.Sub(c.logged) < deadLetterLogEvery) {
			continue
		}
		attrs := []any{"projection", l.proj.Name, "class", class, "records", c.count,
			"offset", c.offset, "key", c.key, "err", redact.String(c.err)}
		if !c.logged.IsZero() {
			attrs = append(attrs, "since", c.logged)
		}
		if class == sinks.ClassKeyMismatch {
			attrs = append(attrs, "key_field", l.proj.KeyField)
		}
		if hint := deadLetterHints[class]; hint != "" {
			attrs = append(attrs, "hint", hint)
		}
		l.log.Warn("records dead-lettered; projector dlq list shows them", attrs...)
		c.logged, c.count = now, 0
	}
}
