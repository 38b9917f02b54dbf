package kafkaclient

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
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
func GroupMembers(ctx context.Context, adm *kadm.Client, group string) (members []GroupMember, settled bool, err error) {
	var out []GroupMember
	classic, cerr := adm.DescribeGroups(ctx, group)
	if cerr == nil {
		if d, ok := classic[group]; ok && d.Err == nil && len(d.Members) > 0 {
			settled = d.State == "Stable"
			for _, m := range d.Members {
				gm := GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Assigned: kadm.TopicsSet{}}
				if a, ok := m.Assigned.AsConsumer(); ok {
					for _, t := range a.Topics {
						gm.Assigned.Add(t.Topic, t.Partitions...)
					}
				}
				out = append(out, gm)
			}
			return out, settled, nil
		} else if ok && d.Err != nil {
			cerr = d.Err
		}
	}
	described, err := adm.DescribeConsumerGroups(ctx, group)
	if err == nil {
		if d, ok := described[group]; ok && d.Err == nil {
			for _, m := range d.Members {
				out = append(out, GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Assigned: m.Assignment})
			}
			return out, true, nil
		} else if ok {
			err = d.Err
		}
	}
	if cerr == nil {
		return nil, true, nil // a classic group without members
	}
	return nil, false, fmt.Errorf("describe consumer group %q: %w", group, errors.Join(cerr, err))
}
