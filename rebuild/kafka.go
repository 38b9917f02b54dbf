package rebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// KafkaAdmin is the Admin of a Kafka cluster.
func KafkaAdmin(adm *kadm.Client) Admin { return kafkaAdmin{adm} }

type kafkaAdmin struct{ adm *kadm.Client }

func (k kafkaAdmin) StartOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	l, err := k.adm.ListStartOffsets(ctx, topic)
	return byPartition(l, topic, err)
}

func (k kafkaAdmin) EndOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	l, err := k.adm.ListEndOffsets(ctx, topic)
	return byPartition(l, topic, err)
}

func byPartition(l kadm.ListedOffsets, topic string, err error) (map[int32]int64, error) {
	if err != nil {
		return nil, err
	}
	if err := l.Error(); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for p, o := range l[topic] {
		out[p] = o.Offset
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("topic %s: no partitions", topic)
	}
	return out, nil
}

func (k kafkaAdmin) Compacted(ctx context.Context, topic string) (bool, error) {
	rcs, err := k.adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return false, err
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return false, err
	}
	if rc.Err != nil {
		return false, rc.Err
	}
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			return strings.Contains(*c.Value, "compact"), nil
		}
	}
	return false, nil
}

func (k kafkaAdmin) DeleteGroup(ctx context.Context, group string) error {
	r, err := k.adm.DeleteGroup(ctx, group)
	if err == nil {
		err = r.Err
	}
	switch {
	case errors.Is(err, kerr.GroupIDNotFound):
		return nil
	case errors.Is(err, kerr.NonEmptyGroup):
		return fmt.Errorf("%w: %w", ErrGroupInUse, err)
	}
	return err
}

// ErrGroupInUse reports a consumer group that still has members: an
// engine of the generation, on some replica, has not stopped yet.
var ErrGroupInUse = errors.New("the consumer group still has members")
