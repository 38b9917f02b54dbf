package projection

import (
	"errors"
	"fmt"

	"github.com/projector-dev/projector/internal/redact"
)

// MaxTopicLen is the longest topic name Kafka accepts.
const MaxTopicLen = 249

// ErrBadTopic reports a topic name Kafka would refuse.
var ErrBadTopic = errors.New("not a topic name Kafka accepts")

// CheckTopic refuses a topic name Kafka would refuse: 1 to MaxTopicLen
// characters from a-z, A-Z, 0-9, '.', '_' and '-', and neither "." nor
// "..". Refusing it here, before anything is written, spares a run that
// creates tables and then fails on its first fetch or produce. The error
// quotes the name clipped (see redact.Clip), so that any name, however
// long, costs the message a few hundred bytes.
func CheckTopic(topic string) error {
	why := ""
	switch {
	case topic == "":
		why = "it is empty"
	case topic == "." || topic == "..":
		why = `"." and ".." are reserved`
	case len(topic) > MaxTopicLen:
		why = fmt.Sprintf("it is %d characters long, at most %d are allowed", len(topic), MaxTopicLen)
	default:
		for _, c := range []byte(topic) {
			if !topicChar(c) {
				why = fmt.Sprintf("it holds the character %q", rune(c))
				if c >= 0x80 {
					why = "it holds a character outside ASCII"
				}
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("topic %q: %w: %s; a topic name has 1 to %d characters from a-z, A-Z, 0-9, '.', '_' and '-'",
		redact.Clip(topic), ErrBadTopic, why, MaxTopicLen)
}

func topicChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}
