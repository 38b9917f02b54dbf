package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

func offsetsCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("projector offsets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &ffcli.Command{
		Name:       "offsets",
		ShortUsage: "projector offsets <list|reset|audit> [flags]",
		ShortHelp:  "List, move and audit the stored offsets of an identity.",
		FlagSet:    fs,
		Subcommands: []*ffcli.Command{
			newStatusCommand("list", "projector offsets list [flags]", stdout, stderr),
			offsetsResetCommand(stdout, stderr),
			offsetsAuditCommand(stdout, stderr),
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}

// resetTarget is where `offsets reset` moves the stored offsets: exactly
// one of its flags.
type resetTarget struct {
	earliest, latest bool
	offset           int64
	offsetSet        bool
	datetime         string
	at               time.Time // parsed datetime
}

func (r *resetTarget) register(fs *flag.FlagSet) {
	fs.BoolVar(&r.earliest, "to-earliest", false, "move to the log start of each partition")
	fs.BoolVar(&r.latest, "to-latest", false, "move to the log end of each partition (skip everything there now)")
	fs.Func("to-offset", "move to this offset (kept within each partition's log)", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("want an offset of 0 or more, got %q", v)
		}
		r.offset, r.offsetSet = n, true
		return nil
	})
	fs.StringVar(&r.datetime, "to-datetime", "", "move to the first record at or after this RFC 3339 time (e.g. 2026-12-01T09:00:00Z)")
}

func (r *resetTarget) validate() error {
	n := 0
	for _, set := range []bool{r.earliest, r.latest, r.offsetSet, r.datetime != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("give exactly one of --to-earliest, --to-latest, --to-offset N, --to-datetime T")
	}
	if r.datetime != "" {
		at, err := time.Parse(time.RFC3339Nano, r.datetime)
		if err != nil {
			return fmt.Errorf("--to-datetime %q: want an RFC 3339 time such as 2026-12-01T09:00:00Z", r.datetime)
		}
		r.at = at
	}
	return nil
}

func (r *resetTarget) String() string {
	switch {
	case r.earliest:
		return "--to-earliest"
	case r.latest:
		return "--to-latest"
	case r.offsetSet:
		return fmt.Sprintf("--to-offset %d", r.offset)
	}
	return "--to-datetime " + r.at.UTC().Format(time.RFC3339Nano)
}

// parsePartitions reads --partitions: comma-separated partition numbers,
// empty for all of the topic's partitions.
func parsePartitions(s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--partitions %q: want comma-separated partition numbers such as 0,3,7", s)
		}
		if slices.Contains(out, int32(n)) {
			return nil, fmt.Errorf("--partitions %q: partition %d given twice", s, n)
		}
		out = append(out, int32(n))
	}
	slices.Sort(out)
	return out, nil
}

// resetPlan is one partition's line of the plan `offsets reset` prints.
type resetPlan struct {
	Topic          string `json:"topic"`
	Partition      int32  `json:"partition"`
	CurrentOffset  *int64 `json:"current_offset"`
	NewOffset      int64  `json:"new_offset"`
	LogStartOffset int64  `json:"log_start_offset"`
	LogEndOffset   int64  `json:"log_end_offset"`
	OwnerEpoch     *int64 `json:"owner_epoch,omitempty"` // after --execute: the epoch that fences the previous owner
	Note           string `json:"note,omitempty"`
}

func offsetsResetCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c          common
		target     resetTarget
		topic      string
		partitions string
		execute    bool
		actor      string
		asJSON     bool
	)
	return newCommand("reset", "projector offsets reset --topic T (--to-earliest|--to-latest|--to-offset N|--to-datetime T) [--partitions 0,1] [--execute]",
		"Move the stored offsets of a topic's partitions; prints the plan, and applies it with --execute.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "brokers", "database-url", "identity")
			fs.StringVar(&topic, "topic", "", "the topic whose stored offsets move (required)")
			fs.StringVar(&partitions, "partitions", "", "comma-separated partitions to move (default: every partition of the topic)")
			target.register(fs)
			fs.BoolVar(&execute, "execute", false, "apply the plan; without it nothing changes")
			fs.StringVar(&actor, "actor", defaultActor(), "who resets, for the audit log (default: $USER)")
			fs.BoolVar(&asJSON, "json", false, "print the plan as JSON objects instead of a table")
		},
		func(ctx context.Context, _ []string) error {
			if topic == "" {
				return errors.New("--topic is required: the topic whose stored offsets move")
			}
			if err := projection.CheckTopic(topic); err != nil {
				return fmt.Errorf("--topic: %w", err)
			}
			if err := target.validate(); err != nil {
				return err
			}
			parts, err := parsePartitions(partitions)
			if err != nil {
				return err
			}
			if execute && strings.TrimSpace(actor) == "" {
				return errors.New("--actor: say who resets, for the audit log")
			}
			adm, closeAdm, err := c.admin()
			if err != nil {
				return err
			}
			defer closeAdm()
			pool, err := connectEngine(ctx, c.database(), tableOffsets, tableOffsetsAudit)
			if err != nil {
				return err
			}
			defer pool.Close()
			offsets := postgres.NewOffsets(pool, c.identity)
			plan, err := planReset(ctx, adm, offsets, topic, parts, &target)
			if err != nil {
				return err
			}
			if execute {
				to := make(map[sinks.TP]int64, len(plan))
				for _, p := range plan {
					to[sinks.TP{Topic: p.Topic, Partition: p.Partition}] = p.NewOffset
				}
				done, err := offsets.ResetAs(ctx, deadletters.CommandActor(actor), target.String(), to)
				if err != nil {
					return err
				}
				for i := range plan {
					for _, d := range done {
						if d.Topic == plan[i].Topic && d.Partition == plan[i].Partition {
							plan[i].CurrentOffset, plan[i].OwnerEpoch = d.OldOffset, &d.Epoch
						}
					}
				}
				group := moveEmptyGroup(ctx, adm, c.identity, plan)
				if asJSON { // stdout is the plan alone
					fmt.Fprintln(stderr, group)
				} else {
					defer fmt.Fprintln(stdout, group)
				}
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(plan)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TOPIC\tPARTITION\tCURRENT-OFFSET\tNEW-OFFSET\tLOG-START-OFFSET\tLOG-END-OFFSET")
			for _, p := range plan {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\n", p.Topic, p.Partition, orDash(p.CurrentOffset), p.NewOffset, p.LogStartOffset, p.LogEndOffset)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, p := range plan {
				if p.Note != "" {
					fmt.Fprintf(stdout, "note: %s/%d: %s\n", p.Topic, p.Partition, p.Note)
				}
			}
			if !slices.ContainsFunc(plan, func(p resetPlan) bool { return p.CurrentOffset != nil || p.OwnerEpoch != nil && *p.OwnerEpoch > 1 }) {
				// A mistyped --identity would otherwise seed offsets no member reads.
				fmt.Fprintf(stdout, "note: identity %q has no stored offsets on %s; --execute stores them for a member of that identity to start from\n", c.identity, topic)
			}
			if !execute {
				fmt.Fprintln(stdout, "dry run: nothing changed; add --execute to move these stored offsets")
				return nil
			}
			fmt.Fprintf(stdout, "moved %d stored offsets of identity %q (audited as %s). A member running one of these partitions is fenced at its next commit, "+
				"then resumes it from the new offset (a halted partition within %s).\n",
				len(plan), c.identity, actor, projector.ResetCheckInterval)
			return nil
		})
}

// moveEmptyGroup commits the reset offsets to the identity's Kafka
// consumer group too when the group has no members, so that Kafka's tools
// and autoscalers show the lag from the new offsets before a member runs,
// and returns a line saying what it did. The group's offsets are
// advisory (members start from the stored ones and commit those to the
// group), so a group with members is left to them: the brokers refuse a
// commit to it from outside anyway, and the members commit the new
// offsets once they resume from them. A failure is reported, not
// returned: the stored offsets, which count, have moved.
func moveEmptyGroup(ctx context.Context, adm *kadm.Client, group string, plan []resetPlan) string {
	described, err := adm.DescribeGroups(ctx, group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		return fmt.Sprintf("note: the Kafka consumer group %q was left as it is (describing it failed: %v); its offsets are advisory, and a member commits the stored ones to it", group, err)
	}
	switch state := described[group].State; state {
	case "Empty":
	case "Dead", "":
		return fmt.Sprintf("note: the Kafka consumer group %q does not exist yet: the first member creates it and commits the stored offsets to it", group)
	default:
		return fmt.Sprintf("note: the Kafka consumer group %q is %s, not empty: its members commit the new offsets to it once they resume from them", group, state)
	}
	to := kadm.Offsets{}
	for _, p := range plan {
		to.AddOffset(p.Topic, p.Partition, p.NewOffset, -1)
	}
	res, err := adm.CommitOffsets(ctx, group, to)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		return fmt.Sprintf("note: the offsets of the empty Kafka consumer group %q were not moved (%v); they are advisory, and a member commits the stored ones to it", group, err)
	}
	return fmt.Sprintf("moved the offsets of the empty Kafka consumer group %q too, for Kafka's tools and autoscalers (advisory: members start from the stored offsets)", group)
}

// resetInputError is a reset the brokers cannot plan, naming the input
// that is wrong: a flag of the command, a field of the admin API.
type resetInputError struct{ flag, field, msg string }

func (e *resetInputError) Error() string { return e.flag + e.msg }

// apiError words e for the admin API, naming the field.
func (e *resetInputError) apiError() string { return e.field + e.msg }

// planReset works out where each partition's stored offset moves.
func planReset(ctx context.Context, adm *kadm.Client, offsets *postgres.Offsets, topic string, parts []int32, target *resetTarget) ([]resetPlan, error) {
	bounds, err := listBounds(ctx, adm, topic)
	if err != nil {
		return nil, err
	}
	var all []int32
	for tp := range bounds {
		all = append(all, tp.Partition)
	}
	if len(all) == 0 {
		return nil, &resetInputError{flag: "--topic ", field: "topic ", msg: fmt.Sprintf("%q: no such topic in Kafka", topic)}
	}
	slices.Sort(all)
	if len(parts) == 0 {
		parts = all
	}
	for _, p := range parts {
		if !slices.Contains(all, p) {
			return nil, &resetInputError{flag: "--partitions: ", field: "partitions: ", msg: fmt.Sprintf("topic %q has no partition %d (it has %d partitions)", topic, p, len(all))}
		}
	}
	var at kadm.ListedOffsets
	if target.datetime != "" {
		if at, err = adm.ListOffsetsAfterMilli(ctx, target.at.UnixMilli(), topic); err != nil {
			return nil, fmt.Errorf("list offsets at %s: %w", target.datetime, err)
		}
	}
	stored, err := offsets.List(ctx)
	if err != nil {
		return nil, err
	}
	current := map[int32]*int64{}
	for _, s := range stored {
		if s.Topic == topic {
			current[s.Partition] = s.NextOffset
		}
	}
	plan := make([]resetPlan, 0, len(parts))
	for _, p := range parts {
		b := bounds[sinks.TP{Topic: topic, Partition: p}]
		line := resetPlan{Topic: topic, Partition: p, CurrentOffset: current[p], LogStartOffset: b.start, LogEndOffset: b.end}
		switch {
		case target.earliest:
			line.NewOffset = b.start
		case target.latest:
			line.NewOffset = b.end
		case target.offsetSet:
			line.NewOffset = min(max(target.offset, b.start), b.end)
			if line.NewOffset != target.offset {
				line.Note = fmt.Sprintf("offset %d is outside the log [%d, %d]; using %d", target.offset, b.start, b.end, line.NewOffset)
			}
		default:
			o, ok := at.Lookup(topic, p)
			if !ok {
				return nil, fmt.Errorf("list offset of %s/%d at %s: none listed", topic, p, target.datetime)
			}
			if o.Err != nil {
				return nil, fmt.Errorf("list offset of %s/%d at %s: %w", topic, p, target.datetime, o.Err)
			}
			line.NewOffset = min(max(o.Offset, b.start), b.end)
			if o.Offset < 0 {
				line.NewOffset = b.end // nothing at or after that time
			}
		}
		plan = append(plan, line)
	}
	return plan, nil
}

func offsetsAuditCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		limit  int
		asJSON bool
	)
	return newCommand("audit", "projector offsets audit [flags]", "List the identity's offset resets, newest first.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "identity")
			fs.IntVar(&limit, "limit", 50, "show at most this many resets (0: all)")
			fs.BoolVar(&asJSON, "json", false, "print JSON objects instead of a table")
		},
		func(ctx context.Context, _ []string) error {
			pool, err := connectEngine(ctx, c.database(), tableOffsetsAudit)
			if err != nil {
				return err
			}
			defer pool.Close()
			resets, err := postgres.NewOffsets(pool, c.identity).ListResets(ctx, limit)
			if err != nil {
				return err
			}
			type row struct {
				ID         int64     `json:"id"`
				At         time.Time `json:"at"`
				Actor      string    `json:"actor"`
				OSUser     string    `json:"os_user"`
				DBUser     string    `json:"db_user"`
				Topic      string    `json:"topic"`
				Partition  int32     `json:"partition"`
				OldOffset  *int64    `json:"old_offset"`
				NewOffset  int64     `json:"new_offset"`
				OwnerEpoch int64     `json:"owner_epoch"`
				Target     string    `json:"target"`
			}
			rows := make([]row, 0, len(resets))
			for _, r := range resets {
				rows = append(rows, row{r.ID, r.At, r.Actor, r.OSUser, r.DBUser, r.Topic, r.Partition, r.OldOffset, r.NewOffset, r.Epoch, r.Detail})
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tAT\tACTOR\tOS-USER\tDB-USER\tTOPIC\tPARTITION\tOLD-OFFSET\tNEW-OFFSET\tOWNER-EPOCH\tTARGET")
			for _, r := range rows {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\n", r.ID, r.At.UTC().Format(time.RFC3339), r.Actor,
					orDashString(r.OSUser), orDashString(r.DBUser), r.Topic, r.Partition,
					orDash(r.OldOffset), r.NewOffset, r.OwnerEpoch, r.Target)
			}
			return tw.Flush()
		})
}
