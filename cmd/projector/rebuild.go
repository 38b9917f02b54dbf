package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/rebuild"
)

func rebuildCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("projector rebuild", flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &ffcli.Command{
		Name:       "rebuild",
		ShortUsage: "projector rebuild <start|status|list|cancel|rollback|cleanup> [flags]",
		ShortHelp:  "Rebuild a projection into a new generation beside the live one, follow, cancel or roll back its operations, and drop retired generations.",
		FlagSet:    fs,
		Subcommands: []*ffcli.Command{
			rebuildStartCommand(stdout, stderr),
			rebuildStatusCommand(stdout, stderr),
			rebuildListCommand(stdout, stderr),
			rebuildCancelCommand(stdout, stderr),
			rebuildRollbackCommand(stdout, stderr),
			rebuildCleanupCommand(stdout, stderr),
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}

// The usages of the flags several rebuild commands share: one variable,
// one meaning.
const (
	rebuildProjectionUsage = "the projection, by name (required)"
	rebuildActorUsage      = "who asks, recorded with the operation (default: $USER)"
	rebuildJSONUsage       = "print JSON instead of text"
)

// openRebuilds connects to the database of --database-url and returns the
// store of its generations and operations, refusing a database where no
// replica of a version that keeps generations has started.
func openRebuilds(ctx context.Context, src dbSource) (*rebuild.Store, func(), error) {
	pool, err := connect(ctx, src)
	if err != nil {
		return nil, nil, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('projector_rebuilds') IS NOT NULL AND to_regclass('projector_generations') IS NOT NULL`).Scan(&exists); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("look up the tables of rebuild operations: %w", err)
	}
	if !exists {
		pool.Close()
		return nil, nil, errors.New("no tables of generations and rebuild operations in this database: projector run of this version creates them when it starts; check --database-url")
	}
	return rebuild.NewStore(pool).AsOSUser(deadletters.CommandActor("").OSUser), pool.Close, nil
}

// operationID reads the one positional argument, an operation id, letting
// flags follow it.
func operationID(fs *flag.FlagSet, args []string, path string, optional bool) (string, error) {
	for i := 0; i < len(args)-1; i++ {
		if err := fs.Parse(args[i+1:]); err != nil {
			return "", err
		}
		args = append(args[:i+1:i+1], fs.Args()...)
	}
	if len(args) == 0 && optional {
		return "", nil
	}
	if len(args) != 1 {
		return "", &usageError{msg: path + ": want exactly one argument, the operation id (see projector rebuild list)"}
	}
	if _, err := uuid.Parse(args[0]); err != nil {
		return "", &usageError{msg: fmt.Sprintf("%s: %q is not an operation id (see projector rebuild list)", path, redact.Clip(args[0]))}
	}
	return args[0], nil
}

// printStarted prints an operation a start or a rollback recorded, and how to
// follow it.
func printStarted(w io.Writer, op rebuild.Operation, asJSON bool) error {
	if asJSON {
		return writeJSON(w, op)
	}
	what := "rebuild"
	if op.Kind == rebuild.KindRollback {
		what = "rollback"
	}
	fmt.Fprintf(w, "operation %s %s: %s of projection %s, generation %d → %d (identity %s)\n",
		op.ID, op.State, what, op.Projection, op.FromGeneration, op.Generation, op.Identity)
	fmt.Fprintln(w, "every replica of projector run drives it; without one running it stays accepted")
	fmt.Fprintf(w, "watch it:   projector rebuild status %s --watch\n", op.ID)
	fmt.Fprintf(w, "cancel it:  projector rebuild cancel %s\n", op.ID)
	return nil
}

func rebuildStartCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		name    string
		config  string
		partial bool
		retain  time.Duration
		actor   string
		asJSON  bool
	)
	return newCommand("start", "projector rebuild start --projection NAME [--config FILE] [--allow-partial-history] [--retain 24h]",
		"Start a rebuild of a projection into a new generation, from the earliest offset, beside the live one; it cuts over once caught up. "+
			"With --config the new generation is defined as the file defines the projection, without it as the live generation is (a fix of the code that folds it).", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "identity")
			fs.StringVar(&name, "projection", "", rebuildProjectionUsage)
			fs.StringVar(&config, "config", "", "projection file whose definition of the projection the new generation takes; empty: the live generation's definition")
			fs.BoolVar(&partial, "allow-partial-history", false, "rebuild even where the topic's retention deleted records the rebuild would need, from what is left (recorded with the operation)")
			fs.DurationVar(&retain, "retain", rebuild.DefaultRetain, "how long the generation it replaces is kept, retired, for a rollback")
			fs.StringVar(&actor, "actor", defaultActor(), rebuildActorUsage)
			fs.BoolVar(&asJSON, "json", false, rebuildJSONUsage)
		},
		func(ctx context.Context, _ []string) error {
			if name == "" {
				return errors.New("--projection is required: the projection to rebuild")
			}
			req := rebuild.Request{Identity: c.identity, Projection: name, AllowPartialHistory: partial, Actor: actor, Retain: retain}
			if config != "" {
				p, err := forgetProjection(config, name)
				if err != nil {
					return err
				}
				def, err := p.Definition()
				if err != nil {
					return fmt.Errorf("--config: %w", err)
				}
				req.Definition = &def
			}
			store, closeStore, err := openRebuilds(ctx, c.database())
			if err != nil {
				return err
			}
			defer closeStore()
			op, err := store.Start(ctx, req)
			if err != nil {
				return operationError(err)
			}
			return printStarted(stdout, op, asJSON)
		})
}

func rebuildRollbackCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		name   string
		actor  string
		asJSON bool
	)
	return newCommand("rollback", "projector rebuild rollback --projection NAME [--json]",
		"Make the projection's newest retired generation live again: it resumes from its own offsets, catches up, and cuts over as a rebuild does.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "identity")
			fs.StringVar(&name, "projection", "", rebuildProjectionUsage)
			fs.StringVar(&actor, "actor", defaultActor(), rebuildActorUsage)
			fs.BoolVar(&asJSON, "json", false, rebuildJSONUsage)
		},
		func(ctx context.Context, _ []string) error {
			if name == "" {
				return errors.New("--projection is required: the projection to roll back")
			}
			store, closeStore, err := openRebuilds(ctx, c.database())
			if err != nil {
				return err
			}
			defer closeStore()
			op, err := store.Rollback(ctx, c.identity, name, actor)
			if err != nil {
				return operationError(err)
			}
			return printStarted(stdout, op, asJSON)
		})
}

// operationError words a refusal of the store: its message, which names
// what is in the way, with its code.
func operationError(err error) error {
	var e *rebuild.Error
	if errors.As(err, &e) {
		return fmt.Errorf("%s (%s)", e.Message, e.Code)
	}
	return err
}

func rebuildStatusCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		asJSON bool
		watch  bool
		fset   *flag.FlagSet
	)
	return newCommand("status", "projector rebuild status [ID] [--watch] [--json]",
		"Show a rebuild operation: its state, progress, estimate and error. Without ID, those in flight, else the newest. "+
			"--watch follows it every second until it ends, and exits 0 when it completed, 1 when it failed or was cancelled.", stderr,
		func(fs *flag.FlagSet) {
			fset = fs
			c.register(fs, "database-url", "identity")
			fs.BoolVar(&asJSON, "json", false, rebuildJSONUsage)
			fs.BoolVar(&watch, "watch", false, "refresh every second until the operation ends")
		},
		func(ctx context.Context, args []string) error {
			id, err := operationID(fset, args, "rebuild status", true)
			if err != nil {
				return err
			}
			store, closeStore, err := openRebuilds(ctx, c.database())
			if err != nil {
				return err
			}
			defer closeStore()
			ops, err := shownOperations(ctx, store, c.identity, id)
			if err != nil {
				return err
			}
			if !watch {
				if asJSON {
					if id != "" {
						return writeJSON(stdout, ops[0])
					}
					return writeJSON(stdout, ops)
				}
				for i, op := range ops {
					if i > 0 {
						fmt.Fprintln(stdout)
					}
					if err := writeOperation(stdout, op, terminal(stdout)); err != nil {
						return err
					}
				}
				return nil
			}
			if len(ops) > 1 {
				return fmt.Errorf("%d operations of identity %s are in flight: name the one to watch (projector rebuild status ID --watch)", len(ops), c.identity)
			}
			return watchOperation(ctx, stdout, store, ops[0], asJSON)
		})
}

// shownOperations are the operations status shows: id's, or identity's in
// flight, or else its newest.
func shownOperations(ctx context.Context, store *rebuild.Store, identity, id string) ([]rebuild.Operation, error) {
	if id != "" {
		op, ok, err := store.Operation(ctx, id)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("no operation %s (see projector rebuild list)", id)
		}
		return []rebuild.Operation{op}, nil
	}
	ops, err := store.Operations(ctx, identity, true)
	if err != nil || len(ops) > 0 {
		return ops, err
	}
	if ops, err = store.Operations(ctx, identity, false); err != nil {
		return nil, err
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("identity %s has no rebuild operations; check --identity", identity)
	}
	return ops[:1], nil
}

// watchOperation shows op every second until it ends: on a terminal one
// line redrawn in place, else a line each time it moves (a JSON object
// with --json).
func watchOperation(ctx context.Context, w io.Writer, store *rebuild.Store, op rebuild.Operation, asJSON bool) error {
	tty := terminal(w) && !asJSON
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := ""
	for {
		line := progressLine(op)
		switch {
		case asJSON:
			if line != last {
				if err := writeJSON(w, op); err != nil {
					return err
				}
			}
		case tty:
			fmt.Fprintf(w, "\r\033[K%s", line)
		case line != last:
			fmt.Fprintln(w, line)
		}
		last = line
		if op.Done() {
			break
		}
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(w)
			}
			return nil // interrupted: the operation goes on
		case <-tick.C:
		}
		next, ok, err := store.Operation(ctx, op.ID)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return err
		}
		if !ok {
			return fmt.Errorf("operation %s no longer exists", op.ID)
		}
		op = next
	}
	if tty {
		fmt.Fprintln(w)
	}
	if !asJSON {
		fmt.Fprintln(w)
		if err := writeOperation(w, op, false); err != nil {
			return err
		}
	}
	if op.State != rebuild.StateCompleted {
		return fmt.Errorf("operation %s %s%s", op.ID, op.State, errorSuffix(op))
	}
	return nil
}

func errorSuffix(op rebuild.Operation) string {
	if op.Error == nil {
		return ""
	}
	return fmt.Sprintf(": %s (%s)", redact.String(op.Error.Message), op.Error.Code)
}

// terminal reports whether w is a terminal, where a progress bar is drawn.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine is op in one line: state, a bar of the records done, the
// rate and the estimate.
func progressLine(op rebuild.Operation) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s g%d→g%d %s", shortID(op.ID), op.Kind, op.Projection, op.FromGeneration, op.Generation, op.State)
	if op.RecordsRemaining != nil {
		total := op.RecordsDone + *op.RecordsRemaining
		frac := 1.0
		if total > 0 {
			frac = float64(op.RecordsDone) / float64(total)
		}
		const width = 30
		n := int(frac * width)
		fmt.Fprintf(&b, " [%s%s] %3.0f%% %d/%d", strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, op.RecordsDone, total)
	} else if op.RecordsDone > 0 {
		fmt.Fprintf(&b, " %d done", op.RecordsDone)
	}
	if op.Rate != nil {
		fmt.Fprintf(&b, " %.0f/s", *op.Rate)
	}
	if op.ETASeconds != nil {
		fmt.Fprintf(&b, " eta %s", etaText(op))
	}
	if op.Waiting != "" {
		fmt.Fprintf(&b, " (%s)", oneLine(op.Waiting))
	}
	return b.String()
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func etaText(op rebuild.Operation) string {
	switch {
	case op.Done():
		return "-"
	case op.ETASeconds != nil:
		return (time.Duration(*op.ETASeconds * float64(time.Second))).Round(time.Second).String()
	case op.Converging != nil && !*op.Converging:
		return "never (not converging)"
	}
	return "-"
}

// writeOperation prints every field of op for people, with a progress
// bar on a terminal.
func writeOperation(w io.Writer, op rebuild.Operation, bar bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	field := func(name string, value any) { fmt.Fprintf(tw, "%s\t%v\n", name, value) }
	field("operation", op.ID)
	field("state", op.State)
	field("kind", op.Kind)
	field("projection", fmt.Sprintf("%s (identity %s)", op.Projection, op.Identity))
	field("generation", fmt.Sprintf("%d → %d", op.FromGeneration, op.Generation))
	field("records done", op.RecordsDone)
	field("records remaining", orDash(op.RecordsRemaining))
	if op.Rate != nil {
		field("events/s", fmt.Sprintf("%.0f", *op.Rate))
	} else {
		field("events/s", "-")
	}
	if op.ArrivalRate != nil {
		field("arrivals/s", fmt.Sprintf("%.0f", *op.ArrivalRate))
	}
	field("eta", etaText(op))
	switch {
	case op.Converging == nil:
		field("converging", "-")
	case *op.Converging:
		field("converging", "yes")
	default:
		field("converging", "no: the topic grows faster than the rebuild applies it; raise --rebuild-rate or add replicas")
	}
	field("waiting", orDashString(oneLine(op.Waiting)))
	if op.Error != nil {
		field("error", fmt.Sprintf("%s: %s", op.Error.Code, oneLine(redact.String(op.Error.Message))))
	}
	if op.AllowPartialHistory {
		field("partial history", "allowed")
	}
	for _, d := range op.DeletedRecords {
		field("history deleted", fmt.Sprintf("%s/%d: the first %d records", d.Topic, d.Partition, d.Records))
	}
	field("actor", orDashString(op.Actor))
	field("os user", orDashString(op.OSUser))
	field("db user", orDashString(op.DBUser))
	if op.CancelledBy != "" {
		field("cancelled by", fmt.Sprintf("%s (os user %s, db user %s)", op.CancelledBy, orDashString(op.CancelledByOSUser), orDashString(op.CancelledByDBUser)))
	}
	field("retain", (time.Duration(op.RetainSeconds) * time.Second).String())
	field("created", op.CreatedAt.Format(timeFormat))
	field("started", timeOrDash(op.StartedAt))
	field("cutover", timeOrDash(op.CutoverAt))
	field("finished", timeOrDash(op.FinishedAt))
	field("updated", op.UpdatedAt.Format(timeFormat))
	if err := tw.Flush(); err != nil {
		return err
	}
	if bar && !op.Done() {
		_, err := fmt.Fprintln(w, progressLine(op))
		return err
	}
	return nil
}

func rebuildListCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		asJSON bool
	)
	return newCommand("list", "projector rebuild list [--json]", "List the identity's rebuild operations, newest first.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "identity")
			fs.BoolVar(&asJSON, "json", false, rebuildJSONUsage)
		},
		func(ctx context.Context, _ []string) error {
			store, closeStore, err := openRebuilds(ctx, c.database())
			if err != nil {
				return err
			}
			defer closeStore()
			ops, err := store.Operations(ctx, c.identity, false)
			if err != nil {
				return err
			}
			if asJSON {
				if ops == nil {
					ops = []rebuild.Operation{}
				}
				return writeJSON(stdout, ops)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPROJECTION\tKIND\tGEN\tSTATE\tDONE\tREMAINING\tETA\tCREATED")
			for _, op := range ops {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d→%d\t%s\t%d\t%s\t%s\t%s\n", op.ID, op.Projection, op.Kind, op.FromGeneration, op.Generation,
					op.State, op.RecordsDone, orDash(op.RecordsRemaining), etaText(op), op.CreatedAt.Format(timeFormat))
			}
			return tw.Flush()
		})
}

func rebuildCancelCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		actor  string
		asJSON bool
		fset   *flag.FlagSet
	)
	return newCommand("cancel", "projector rebuild cancel ID [--json]",
		"Cancel a rebuild operation that has not begun its cutover: the replicas drop the new generation's table and offsets, and the live generation goes on.", stderr,
		func(fs *flag.FlagSet) {
			fset = fs
			c.register(fs, "database-url")
			fs.StringVar(&actor, "actor", defaultActor(), rebuildActorUsage)
			fs.BoolVar(&asJSON, "json", false, rebuildJSONUsage)
		},
		func(ctx context.Context, args []string) error {
			id, err := operationID(fset, args, "rebuild cancel", false)
			if err != nil {
				return err
			}
			store, closeStore, err := openRebuilds(ctx, c.database())
			if err != nil {
				return err
			}
			defer closeStore()
			op, err := store.Cancel(ctx, id, actor)
			var e *rebuild.Error
			switch {
			case errors.As(err, &e) && e.Code == rebuild.CodeCutoverLost:
				return fmt.Errorf("operation %s could not be cancelled: it is %s, the cutover began first; once it completes, projector rebuild rollback --projection %s makes the previous generation live again", id, op.State, op.Projection)
			case err != nil:
				return operationError(err)
			}
			if asJSON {
				return writeJSON(stdout, op)
			}
			fmt.Fprintf(stdout, "operation %s cancelled: %s of projection %s to generation %d; generation %d stays live\n", op.ID, op.Kind, op.Projection, op.Generation, op.FromGeneration)
			return nil
		})
}

func rebuildCleanupCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		name    string
		execute bool
		asJSON  bool
	)
	return newCommand("cleanup", "projector rebuild cleanup --projection NAME [--brokers B] [--execute]",
		"Drop the projection's retired generations now, rather than once their retention ends: their tables, stored offsets, dead letters and, with --brokers, Kafka consumer groups. "+
			"They can no longer be rolled back to. Lists them, and drops them with --execute.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "identity", "brokers")
			fs.StringVar(&name, "projection", "", "the projection whose retired generations to drop (required)")
			fs.BoolVar(&execute, "execute", false, "drop them; without it nothing changes")
			fs.BoolVar(&asJSON, "json", false, rebuildJSONUsage)
		},
		func(ctx context.Context, _ []string) error {
			if name == "" {
				return errors.New("--projection is required: the projection whose retired generations to drop")
			}
			store, closeStore, err := openRebuilds(ctx, c.database())
			if err != nil {
				return err
			}
			defer closeStore()
			retired, err := retiredGenerations(ctx, store, c.identity, name)
			if err != nil {
				return err
			}
			if asJSON && !execute {
				return writeJSON(stdout, cleanupRows(retired, false))
			}
			if len(retired) == 0 {
				if asJSON {
					return writeJSON(stdout, cleanupRows(nil, true))
				}
				fmt.Fprintf(stdout, "projection %s has no retired generation: nothing to drop\n", name)
				return nil
			}
			if !execute {
				writeCleanup(stdout, retired)
				fmt.Fprintln(stdout, "dry run: nothing changed; add --execute to drop these generations, which can then no longer be rolled back to")
				return nil
			}
			// A rollback in flight may be making one of them live.
			ops, err := store.Operations(ctx, c.identity, true)
			if err != nil {
				return err
			}
			for _, op := range ops {
				if op.Projection == name {
					return fmt.Errorf("projection %s has operation %s in flight (%s): wait for it to end, or cancel it, before dropping generations", name, op.ID, op.State)
				}
			}
			var admin rebuild.Admin
			if c.brokers != "" {
				adm, closeAdm, err := c.admin()
				if err != nil {
					return err
				}
				defer closeAdm()
				admin = rebuild.KafkaAdmin(adm)
			}
			for _, g := range retired {
				if err := store.Drop(ctx, g, admin); err != nil {
					return err
				}
				if !asJSON {
					fmt.Fprintf(stdout, "dropped generation %d of projection %s: table %s, identity %s\n", g.N, g.Projection, g.RetiredTable(), g.GroupID)
				}
			}
			if asJSON {
				return writeJSON(stdout, cleanupRows(retired, true))
			}
			if admin == nil {
				fmt.Fprintln(stdout, "their Kafka consumer groups are left: no --brokers given; delete them with kafka-consumer-groups --delete, or run again with --brokers")
			}
			return nil
		})
}

// retiredGenerations returns the projection's retired generations,
// refusing a projection identity has no generation of.
func retiredGenerations(ctx context.Context, store *rebuild.Store, identity, name string) ([]rebuild.Generation, error) {
	gs, err := store.Generations(ctx, identity)
	if err != nil {
		return nil, err
	}
	var out []rebuild.Generation
	known := false
	for _, g := range gs {
		if g.Projection != name {
			continue
		}
		known = true
		if g.State == rebuild.Retired {
			out = append(out, g)
		}
	}
	if !known {
		return nil, fmt.Errorf("--projection %q: identity %s has no generation of it; check --projection and --identity", redact.Clip(name), identity)
	}
	return out, nil
}

type cleanupRow struct {
	Projection  string     `json:"projection"`
	Generation  int        `json:"generation"`
	Table       string     `json:"table"`
	Group       string     `json:"group"`
	RetiredAt   *time.Time `json:"retired_at"`
	RetainUntil *time.Time `json:"retain_until"`
	Dropped     bool       `json:"dropped"`
}

func cleanupRows(gs []rebuild.Generation, dropped bool) []cleanupRow {
	out := make([]cleanupRow, 0, len(gs))
	for _, g := range gs {
		out = append(out, cleanupRow{g.Projection, g.N, g.RetiredTable(), g.GroupID, g.RetiredAt, g.RetainUntil, dropped})
	}
	return out
}

func writeCleanup(w io.Writer, gs []rebuild.Generation) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tGEN\tTABLE\tGROUP\tRETIRED\tRETAIN-UNTIL")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", g.Projection, g.N, g.RetiredTable(), g.GroupID, timeOrDash(g.RetiredAt), timeOrDash(g.RetainUntil))
	}
	_ = tw.Flush()
}

// registerAdminAPI registers run's --admin-api, which the admin API on
// --api-addr replaced: an admin API on --http-addr would sit beside
// /metrics, which is not authenticated, and a flag kept that refuses to
// start says where it went, where one dropped would only say unknown.
func registerAdminAPI(fs *flag.FlagSet, on *bool) {
	fs.BoolVar(on, "admin-api", false, "replaced: the admin API (rebuilds, dead letters, offset resets) is served under /admin/v1/ on --api-addr with --api, authenticated by --auth (scope admin); this flag refuses to start")
}

// errAdminAPIMoved is run's answer to --admin-api.
var errAdminAPIMoved = errors.New("--admin-api: the admin API moved to --api-addr: drop --admin-api and add --api; it is authenticated by --auth and needs scope admin (see docs/api.md#admin-api)")
