package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

func migrateCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c  common
		db dbFlags
	)
	return newCommand("migrate", "projector migrate [flags]", "Create the engine's tables and the projections' tables if missing.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url", "config", "log", "identity")
			db.register(fs, "sessions", "pooler", "startup")
		},
		func(ctx context.Context, _ []string) error {
			if err := db.validate(); err != nil {
				return err
			}
			log, err := c.logger(stderr)
			if err != nil {
				return err
			}
			projs, err := projection.Load(c.config)
			if err != nil {
				return fmt.Errorf("--config: %w", err)
			}
			cfg, err := db.poolConfig(c.databaseURL)
			if err != nil {
				return err
			}
			su := startup{log: log, timeout: db.startupTimeout, base: defaultRetryBase, cap: defaultRetryCap}
			sctx, cancel := su.bound(ctx)
			defer cancel()
			pool, target, err := openDatabase(sctx, cfg, su, false)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := su.do(sctx, "connect", func(ctx context.Context) error { return db.checkPooler(ctx, pool, "migrate", log) }); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "migrating PostgreSQL at %s\n", target)
			// A rebuilt projection's table name is a view of its live
			// generation's table, which is the one to migrate.
			var live []*projection.Projection
			err = su.do(sctx, "read generations", func(ctx context.Context) error {
				live, err = liveProjections(ctx, rebuild.NewStore(pool), c.identity, projs)
				return err
			})
			if err != nil {
				return fmt.Errorf("PostgreSQL at %s: %w", target, err)
			}
			if err := migrate(sctx, su, pool, target, live); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "migrated: engine tables and %d projection tables\n", len(projs))
			return nil
		})
}

// partitionStatus is one row of `projector status`.
type partitionStatus struct {
	Topic          string `json:"topic"`
	Partition      int32  `json:"partition"`
	NextOffset     *int64 `json:"next_offset"`
	LogStartOffset *int64 `json:"log_start_offset"`
	HighWatermark  *int64 `json:"high_watermark"`
	// Lag is nil when it cannot be told: nothing stored, or the stored
	// offset is past the log end.
	Lag        *int64 `json:"lag"`
	OwnerEpoch int64  `json:"owner_epoch"`
	// State is the member's word for the partition when it said one
	// (backing-off, stalled, halted, orphaned), else what the stored
	// offset and the log tell (ok, records-deleted, …). Halt (what halted
	// a halted partition: dead-letter-storm, statements-refused, …),
	// Reason, Member and Since come with the member's word.
	State  string     `json:"state"`
	Halt   string     `json:"halt,omitempty"`
	Reason string     `json:"reason,omitempty"`
	Member string     `json:"member,omitempty"`
	Since  *time.Time `json:"since,omitempty"`
	// Group is the consumer identity whose offset it is: --identity's
	// own (generation 1), or a generation's of a rebuilt projection
	// (Projection), live or being built (GenerationState).
	Group           string `json:"group"`
	Generation      int    `json:"generation"`
	Projection      string `json:"projection,omitempty"`
	GenerationState string `json:"generation_state,omitempty"`
}

// States of a partition in `projector status`.
const (
	stateOK             = "ok"
	stateUnstarted      = "unstarted"       // no offset stored yet
	stateRecordsDeleted = "records-deleted" // stored offset below the log start
	stateBeyondLogEnd   = "beyond-log-end"  // stored offset past the log end
	stateNoLog          = "no-log"          // the partition is not in Kafka
	stateLogNotAsked    = "log-not-asked"   // no --brokers to ask Kafka
)

func statusCommand(stdout, stderr io.Writer) *ffcli.Command {
	return newStatusCommand("status", "projector status [flags]", stdout, stderr)
}

func newStatusCommand(name, usage string, stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		asJSON bool
	)
	return newCommand(name, usage, "Show the stored offset, log bounds and lag of every partition of an identity, and of its rebuilt projections' live generations and generations being built.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "brokers", "database-url", "identity")
			fs.BoolVar(&asJSON, "json", false, "print JSON objects instead of a table")
		},
		func(ctx context.Context, _ []string) error {
			if err := c.checkTransport(); err != nil {
				return err
			}
			pool, err := connectEngine(ctx, c.databaseURL, tableOffsets)
			if err != nil {
				return err
			}
			defer pool.Close()
			gens, err := generationGroups(ctx, pool, c.identity)
			if err != nil {
				return err
			}
			groups := append([]rebuild.Generation{{N: 1, GroupID: c.identity}}, gens...)
			type groupOffsets struct {
				gen    rebuild.Generation
				stored []postgres.Stored
			}
			var all []groupOffsets
			topics := map[string]bool{}
			for _, g := range groups {
				stored, err := postgres.NewOffsets(pool, g.GroupID).List(ctx)
				if err != nil {
					return err
				}
				for _, s := range stored {
					topics[s.Topic] = true
				}
				all = append(all, groupOffsets{gen: g, stored: stored})
			}
			bounds := map[sinks.TP]logBounds{}
			// Without --brokers the stored offsets are still worth
			// showing: after the demo, its embedded broker is gone.
			noLog := strings.TrimSpace(c.brokers) == ""
			if noLog && len(topics) > 0 {
				fmt.Fprintln(stderr, "no --brokers (PROJECTOR_BROKERS): showing the stored offsets without the log's bounds and lag")
			}
			if len(topics) > 0 && !noLog {
				adm, closeAdm, err := c.admin()
				if err != nil {
					return err
				}
				defer closeAdm()
				if bounds, err = listBounds(ctx, adm, slices.Sorted(maps.Keys(topics))...); err != nil {
					return err
				}
			}
			var rows []partitionStatus
			for _, g := range all {
				said, err := postgres.States(ctx, pool, g.gen.GroupID)
				if err != nil {
					return err
				}
				for _, s := range g.stored {
					r := statusOf(s, bounds)
					if noLog {
						r.State = stateLogNotAsked
					}
					if st, ok := said[s.TP]; ok {
						since := st.Since
						r.State, r.Halt, r.Reason, r.Member, r.Since = st.State, st.Halt, st.Reason, st.Member, &since
					}
					r.Group, r.Generation, r.Projection, r.GenerationState = g.gen.GroupID, g.gen.N, g.gen.Projection, g.gen.State
					rows = append(rows, r)
				}
			}
			if rows == nil {
				rows = []partitionStatus{}
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			// A rebuilt projection's generations run under identities of
			// their own: then each row says whose offset it is.
			byGroup := len(gens) > 0
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			header := "TOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-START-OFFSET\tLOG-END-OFFSET\tLAG\tOWNER-EPOCH\tSTATE"
			if byGroup {
				header += "\tGROUP\tGEN"
			}
			fmt.Fprintln(tw, header)
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s", r.Topic, r.Partition, orDash(r.NextOffset),
					orDash(r.LogStartOffset), orDash(r.HighWatermark), orDash(r.Lag), r.OwnerEpoch, r.State)
				if byGroup {
					fmt.Fprintf(tw, "\t%s\t%s", r.Group, genText(r))
				}
				fmt.Fprintln(tw)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			// Reasons are sentences: one line each under the table, a
			// halt's with what halted it.
			for _, r := range rows {
				if r.Reason != "" {
					state := r.State
					if r.Halt != "" {
						state += " (" + r.Halt + ")"
					}
					where := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
					if byGroup {
						where = r.Group + " " + where
					}
					fmt.Fprintf(stdout, "%s %s since %s (member %s): %s\n", where, state,
						r.Since.UTC().Format(time.RFC3339), r.Member, oneLine(r.Reason))
				}
			}
			return nil
		})
}

// genText is a row's generation for the table: its number, and
// "(building)" for a generation being built.
func genText(r partitionStatus) string {
	if r.GenerationState == rebuild.Building {
		return fmt.Sprintf("%d(building)", r.Generation)
	}
	return strconv.Itoa(r.Generation)
}

// generationGroups returns identity's live and building generations that
// run under a consumer identity of their own (those of rebuilt
// projections), none before any rebuild created the generations table.
func generationGroups(ctx context.Context, pool *pgxpool.Pool, identity string) ([]rebuild.Generation, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('projector_generations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up the generations table: %w", err)
	}
	if !exists {
		return nil, nil
	}
	gs, err := rebuild.NewStore(pool).Generations(ctx, identity)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(gs, func(g rebuild.Generation) bool {
		return g.GroupID == identity || g.State != rebuild.Live && g.State != rebuild.Building
	}), nil
}

// statusOf compares a stored offset with its partition's log: an offset
// outside the log has no lag to show, only a state that says why.
func statusOf(s postgres.Stored, bounds map[sinks.TP]logBounds) partitionStatus {
	r := partitionStatus{Topic: s.Topic, Partition: s.Partition, NextOffset: s.NextOffset, OwnerEpoch: s.Epoch, State: stateOK}
	b, ok := bounds[s.TP]
	if !ok {
		r.State = stateNoLog
		return r
	}
	r.LogStartOffset, r.HighWatermark = &b.start, &b.end
	switch {
	case s.NextOffset == nil:
		r.State = stateUnstarted
	case *s.NextOffset > b.end:
		r.State = stateBeyondLogEnd
	default:
		lag := b.end - *s.NextOffset
		r.Lag = &lag
		if *s.NextOffset < b.start {
			r.State = stateRecordsDeleted
		}
	}
	return r
}

// logBounds are a partition's log start and end offsets.
type logBounds struct{ start, end int64 }

// listBounds lists the log bounds of every partition of topics; a topic
// that does not exist has none.
func listBounds(ctx context.Context, adm *kadm.Client, topics ...string) (map[sinks.TP]logBounds, error) {
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list log-start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list log-end offsets: %w", err)
	}
	out := map[sinks.TP]logBounds{}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			return
		}
		if e, ok := ends.Lookup(o.Topic, o.Partition); ok && e.Err == nil {
			out[sinks.TP{Topic: o.Topic, Partition: o.Partition}] = logBounds{start: o.Offset, end: e.Offset}
		}
	})
	return out, nil
}

// admin returns an admin client on --brokers and how to close it.
func (c *common) admin() (*kadm.Client, func(), error) {
	kcfg, err := c.kafkaConfig(nil, nil)
	if err != nil {
		return nil, nil, err
	}
	cl, err := kafkaclient.New(kcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("--brokers: %w", err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}

func orDash(p *int64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}
