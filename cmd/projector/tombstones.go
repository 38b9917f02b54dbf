package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks/postgres"
)

// retentionFlag is --tombstone-retention: a positive duration, whole days
// (7d), or off (negative: kept forever). 0 is refused: it would prune a
// tombstone as soon as it is written.
type retentionFlag time.Duration

func (r *retentionFlag) String() string { return projection.FormatRetention(time.Duration(*r)) }

func (r *retentionFlag) Set(s string) error {
	d, err := projection.ParseRetention(s)
	if err != nil {
		return err
	}
	*r = retentionFlag(d)
	return nil
}

// registerTombstoneRetention registers --tombstone-retention, defaulting to
// the engine's default.
func registerTombstoneRetention(fs *flag.FlagSet, r *retentionFlag) {
	*r = retentionFlag(projector.DefaultTombstoneRetention)
	fs.Var(r, "tombstone-retention", "how long a deleted aggregate's tombstone (its last version, which keeps a late copy of its events from writing the row again) is kept before it is pruned in the background, "+
		"for projections that set no tombstone_retention of their own; like Kafka's delete.retention.ms, keep it longer than events may arrive late, at least the topics' retention.ms. "+
		"A duration such as 72h, whole days such as 30d, or off to keep tombstones forever (0 is refused)")
}

func tombstonesCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("projector tombstones", flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &ffcli.Command{
		Name:       "tombstones",
		ShortUsage: "projector tombstones <forget> [flags]",
		ShortHelp:  "Forget the tombstones of deleted aggregates, for erasure requests.",
		FlagSet:    fs,
		Subcommands: []*ffcli.Command{
			tombstonesForgetCommand(stdout, stderr),
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}

func tombstonesForgetCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		name    string
		key     string
		execute bool
	)
	return newCommand("forget", "projector tombstones forget [--projection P] --key K [--execute]",
		"Delete a deleted aggregate's tombstone, which keeps its id and last version; says what it would delete, and deletes it with --execute.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "config", "identity")
			fs.StringVar(&name, "projection", "", "the projection whose aggregate it is (required when the projection file holds more than one)")
			fs.StringVar(&key, "key", "", "the aggregate's key, as its records carry it (required)")
			fs.BoolVar(&execute, "execute", false, "delete the tombstone; without it nothing changes")
		},
		func(ctx context.Context, _ []string) error {
			if key == "" {
				return errors.New("--key is required: the key of the deleted aggregate whose tombstone to forget")
			}
			file, err := forgetProjection(c.config, name)
			if err != nil {
				return err
			}
			pool, err := connectEngine(ctx, c.database())
			if err != nil {
				return err
			}
			defer pool.Close()
			// Tombstones are kept by the table of the generation that
			// wrote them: a rebuilt projection's live generation's.
			live, err := liveProjections(ctx, rebuild.NewStore(pool), c.identity, []*projection.Projection{file})
			if err != nil {
				return err
			}
			p := live[0]
			shown := redact.Clip(key)
			tomb, exists, err := postgres.FindTombstone(ctx, pool, p, key)
			if err != nil {
				return err
			}
			if exists {
				return liveAggregate(p, shown)
			}
			if tomb == nil {
				fmt.Fprintf(stdout, "projection %s: no tombstone of key %q in table %s: nothing to forget\n", p.Name, shown, p.Table)
				return nil
			}
			what := fmt.Sprintf("the tombstone of key %q in table %s (version %d, deleted at %s)", shown, p.Table, tomb.Version, tomb.DeletedAt.UTC().Format(time.RFC3339))
			if !execute {
				fmt.Fprintf(stdout, "projection %s: would forget %s\n", p.Name, what)
				fmt.Fprintln(stdout, "dry run: nothing changed; add --execute to forget it")
				return nil
			}
			forgot, err := postgres.ForgetTombstone(ctx, pool, p, key)
			if errors.Is(err, postgres.ErrRowExists) {
				return liveAggregate(p, shown) // written again since it was looked at
			}
			if err != nil {
				return err
			}
			if forgot == nil {
				fmt.Fprintf(stdout, "projection %s: no tombstone of key %q in table %s any more: nothing to forget\n", p.Name, shown, p.Table)
				return nil
			}
			fmt.Fprintf(stdout, "projection %s: forgot %s. A late copy of one of its events would now write its row again; "+
				"a running member may keep its last version in memory until the member restarts.\n", p.Name, what)
			return nil
		})
}

// liveAggregate refuses to forget the tombstone of an aggregate whose row
// exists.
func liveAggregate(p *projection.Projection, shown string) error {
	return fmt.Errorf("projection %s: key %q has a row in table %s: the aggregate is not deleted, so there is no tombstone to forget; "+
		"erasing a live aggregate is a delete event's job (a record with a null value, or of an event type the projection deletes on, on topic %s); its tombstone can be forgotten after that",
		p.Name, shown, p.Table, p.Topic)
}

// forgetProjection finds the projection named name in the projection file
// at path; name may be empty when the file holds one projection.
func forgetProjection(path, name string) (*projection.Projection, error) {
	projs, err := projection.Load(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var names []string
	for _, p := range projs {
		if p.Name == name || name == "" && len(projs) == 1 {
			return p, nil
		}
		names = append(names, p.Name)
	}
	if name == "" {
		return nil, fmt.Errorf("--projection is required: %s holds %d projections (%s)", path, len(projs), strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("--projection %q: no such projection in %s (it holds %s)", redact.Clip(name), path, strings.Join(names, ", "))
}
