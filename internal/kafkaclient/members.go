package kafkaclient

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// GroupMember is a member of a consumer group as the group's coordinator
// describes it, with the partitions assigned to it.
type GroupMember struct {
	ID, ClientID, Host string
	Assigned           kadm.TopicsSet
}

// GroupMembers describes group's members under whichever protocol it
// runs: the classic one first, then the consumer protocol (KIP-848),
// whose groups the classic request does not describe. A group without
// members (none ever joined, or all left) has none and no error.
// settled is false while a classic group rebalances: its coordinator then
// describes no member's assignment, though the members still hold their
// partitions. A consumer-protocol group always describes what each member
// holds.
func GroupMembers(ctx context.Context, cl *kgo.Client, group string) (members []GroupMember, settled bool, err error) {
	adm := kadm.NewClient(cl)
	classic, cerr := adm.DescribeGroups(ctx, group)
	if cerr == nil {
		if d, ok := classic[group]; ok && d.Err == nil && len(d.Members) > 0 {
			for _, m := range d.Members {
				gm := GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Assigned: kadm.TopicsSet{}}
				if a, ok := m.Assigned.AsConsumer(); ok {
					for _, t := range a.Topics {
						gm.Assigned.Add(t.Topic, t.Partitions...)
					}
				}
				members = append(members, gm)
			}
			return members, d.State == "Stable", nil
		} else if ok && d.Err != nil {
			cerr = d.Err
		}
	}
	members, err = consumerGroupMembers(ctx, cl, adm, group)
	if err == nil {
		return members, true, nil
	}
	if cerr == nil {
		return nil, true, nil // a classic group without members
	}
	return nil, false, fmt.Errorf("describe consumer group %q: %w", group, errors.Join(cerr, err))
}

// consumerGroupMembers describes a consumer-protocol group. Its
// assignments name topics by ID, with their names where the broker gives
// them; the others are looked up in the cluster's metadata.
func consumerGroupMembers(ctx context.Context, cl *kgo.Client, adm *kadm.Client, group string) ([]GroupMember, error) {
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	var names map[[16]byte]string
	var out []GroupMember
	for _, g := range resp.Groups {
		if g.Group != group {
			continue
		}
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return nil, err
		}
		for _, m := range g.Members {
			gm := GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Assigned: kadm.TopicsSet{}}
			for _, tp := range m.Assignment.TopicPartitions {
				topic := tp.Topic
				if topic == "" {
					if names == nil {
						meta, err := adm.Metadata(ctx)
						if err != nil {
							return nil, fmt.Errorf("topic names of the assignment: %w", err)
						}
						names = map[[16]byte]string{}
						for name, td := range meta.Topics {
							names[td.ID] = name
						}
					}
					topic = names[tp.TopicID]
				}
				if topic != "" {
					gm.Assigned.Add(topic, tp.Partitions...)
				}
			}
			out = append(out, gm)
		}
	}
	return out, nil
}
