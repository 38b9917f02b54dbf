package projection_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/projector-dev/projector/projection"
)

// TestParseRefusesBadTopic: a topic name Kafka would refuse fails the
// projection file when it is loaded (so check, run and dev refuse it
// before they write anything), naming the projection and quoting the
// topic, clipped when it is long.
func TestParseRefusesBadTopic(t *testing.T) {
	long := strings.Repeat("t", 100_000)
	for _, tc := range []struct {
		topic string
		want  string // the error quotes this
	}{
		{`"bad topic/../x"`, `topic "bad topic/../x"`},
		{`"."`, `topic "."`},
		{`".."`, `topic ".."`},
		{`"orders\tv2"`, `topic "orders\tv2"`},
		{`"événements"`, `topic "événements"`},
		{strings.Repeat("a", projection.MaxTopicLen+1), "250 characters long"},
		{long, "(100000 bytes)"},
	} {
		t.Run(tc.topic[:min(len(tc.topic), 20)], func(t *testing.T) {
			_, err := projection.Parse([]byte(edit(t, baseYAML, "    topic: t1\n", "    topic: "+tc.topic+"\n")), ".")
			if !errors.Is(err, projection.ErrBadTopic) {
				t.Fatalf("Parse with topic %s: %v, want ErrBadTopic", clipForLog(tc.topic), err)
			}
			for _, w := range []string{`projection "p1"`, tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", clipForLog(err.Error()), w)
				}
			}
			if len(err.Error()) > 1000 {
				t.Errorf("error is %d bytes long: the topic is not clipped", len(err.Error()))
			}
		})
	}
	for _, ok := range []string{"t", "accounts.events", "a_b-C.9", strings.Repeat("a", projection.MaxTopicLen), "...", "_"} {
		if _, err := projection.Parse([]byte(edit(t, baseYAML, "    topic: t1\n", "    topic: "+strconv.Quote(ok)+"\n")), "."); err != nil {
			t.Errorf("topic %q refused: %v", clipForLog(ok), err)
		}
	}
}

func clipForLog(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
