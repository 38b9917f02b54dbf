package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
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
			cfg, err := db.poolConfig(c.database())
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
	Lag *int64 `json:"lag"`
	// LagSeconds is the age of the record at the stored offset (the
	// oldest not applied), 0 without lag, nil when it cannot be told.
	LagSeconds *float64 `json:"lag_seconds"`
	// DrainSeconds is how long the group's backlog of the topic takes to
	// drain at the rates sampled over --sample; nil when not sampled or
	// when it never drains (NeverDrains: records arrive as fast as they
	// are applied).
	DrainSeconds *float64 `json:"drain_seconds"`
	NeverDrains  bool     `json:"never_drains,omitempty"`
	// ConsumerID, Host and ClientID name the group member the partition
	// is assigned to, as the group's coordinator describes it; empty when
	// none is or the brokers were not asked.
	ConsumerID string `json:"consumer_id,omitempty"`
	Host       string `json:"host,omitempty"`
	ClientID   string `json:"client_id,omitempty"`
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
	stateLogNotAsked    = "log-not-asked"   // no --brokers to ask Kafka, or they did not answer
)

// statusKafkaTimeout bounds what status asks the brokers, so that a
// cluster that does not answer leaves the stored offsets to show.
const statusKafkaTimeout = 5 * time.Second

// defaultStatusSample is how long status watches the offsets move to
// estimate when a backlog drains.
const defaultStatusSample = 2 * time.Second

func statusCommand(stdout, stderr io.Writer) *ffcli.Command {
	return newStatusCommand("status", "projector status [flags]", stdout, stderr)
}

// groupOffsets are the stored offsets of one consumer identity.
type groupOffsets struct {
	gen    rebuild.Generation
	stored []postgres.Stored
	// topics are the topics whose partitions are listed though nothing is
	// stored of them: those stored, and the projection file's.
	topics []string
}

func newStatusCommand(name, usage string, stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		asJSON bool
		sample time.Duration
		fs     *flag.FlagSet
	)
	return newCommand(name, usage, "Show every partition of an identity, and of its rebuilt projections' live generations and generations being built: the stored offset, the log end and lag, the group member assigned it, how old its oldest record not applied is, and when its topic's backlog drains.", stderr,
		func(f *flag.FlagSet) {
			fs = f
			c.register(fs, "brokers", "database-url", "identity", "config")
			fs.BoolVar(&asJSON, "json", false, "print JSON objects instead of a table")
			fs.DurationVar(&sample, "sample", defaultStatusSample, "how long to watch the offsets move to estimate when each backlog drains (DRAIN); 0: do not estimate")
		},
		func(ctx context.Context, _ []string) error {
			if err := c.checkTransport(); err != nil {
				return err
			}
			// The projection file names topics of which nothing may be
			// stored yet; the default file need not exist.
			var projs []*projection.Projection
			configSet := false
			fs.Visit(func(f *flag.Flag) { configSet = configSet || f.Name == "config" })
			if _, err := os.Stat(c.config); configSet || err == nil {
				if projs, err = projection.Load(c.config); err != nil && configSet {
					return fmt.Errorf("--config: %w", err)
				} else if err != nil {
					// The default file, not asked for: its topics are an
					// extra, not worth failing over.
					fmt.Fprintf(stderr, "%s not read (%v): listing the stored topics' partitions only\n", c.config, err)
				}
			}
			pool, err := connectEngine(ctx, c.database(), tableOffsets)
			if err != nil {
				return err
			}
			defer pool.Close()
			gens, err := rebuild.NewStore(pool).OtherGenerations(ctx, c.identity)
			if err != nil {
				return err
			}
			groups := append([]rebuild.Generation{{N: 1, GroupID: c.identity}}, gens...)
			var all []groupOffsets
			topics := map[string]bool{}
			for _, g := range groups {
				stored, err := postgres.NewOffsets(pool, g.GroupID).List(ctx)
				if err != nil {
					return err
				}
				own := map[string]bool{}
				for _, s := range stored {
					own[s.Topic] = true
				}
				for _, p := range projs {
					if g.Projection == "" || g.Projection == p.Name {
						own[p.Topic] = true
					}
				}
				for t := range own {
					topics[t] = true
				}
				all = append(all, groupOffsets{gen: g, stored: stored, topics: slices.Sorted(maps.Keys(own))})
			}
			k := statusKafka{stderr: stderr}
			// Without --brokers, or brokers that do not answer, the stored
			// offsets are still worth showing: after the demo, its
			// embedded broker is gone.
			if strings.TrimSpace(c.brokers) == "" {
				if len(topics) > 0 {
					fmt.Fprintln(stderr, "no --brokers (PROJECTOR_BROKERS): showing the stored offsets without the log's bounds, lag and group members")
				}
			} else if len(topics) > 0 {
				closeKafka, err := k.open(ctx, &c, slices.Sorted(maps.Keys(topics)))
				if err != nil {
					return err
				}
				defer closeKafka()
			}
			var rows []partitionStatus
			for _, g := range all {
				said, err := postgres.States(ctx, pool, g.gen.GroupID)
				if err != nil {
					return err
				}
				members := k.members(ctx, g.gen.GroupID)
				stored := map[sinks.TP]bool{}
				var own []partitionStatus
				add := func(r partitionStatus) {
					if k.bounds == nil {
						r.State = stateLogNotAsked
					}
					tp := sinks.TP{Topic: r.Topic, Partition: r.Partition}
					if st, ok := said[tp]; ok {
						since := st.Since
						r.State, r.Halt, r.Reason, r.Member, r.Since = st.State, st.Halt, st.Reason, st.Member, &since
					}
					if m, ok := members[tp]; ok {
						r.ConsumerID, r.Host, r.ClientID = m.ID, m.Host, m.ClientID
					}
					r.Group, r.Generation, r.Projection, r.GenerationState = g.gen.GroupID, g.gen.N, g.gen.Projection, g.gen.State
					own = append(own, r)
				}
				for _, s := range g.stored {
					stored[s.TP] = true
					add(statusOf(s, k.bounds))
				}
				// The partitions of its topics nothing is stored of: no
				// member has claimed them yet.
				for _, tp := range slices.SortedFunc(maps.Keys(k.bounds), compareTP) {
					if !stored[tp] && slices.Contains(g.topics, tp.Topic) {
						add(statusOf(postgres.Stored{TP: tp}, k.bounds))
					}
				}
				slices.SortFunc(own, func(a, b partitionStatus) int {
					return compareTP(sinks.TP{Topic: a.Topic, Partition: a.Partition}, sinks.TP{Topic: b.Topic, Partition: b.Partition})
				})
				rows = append(rows, own...)
			}
			k.lagSeconds(ctx, rows)
			if err := k.drain(ctx, pool, rows, sample); err != nil {
				return err
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
			// their own: then each row says which generation it is.
			byGen := len(gens) > 0
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			header := "GROUP\tTOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tCONSUMER-ID\tHOST\tCLIENT-ID\tLAG-SECONDS\tDRAIN\tOWNER-EPOCH\tSTATE"
			if byGen {
				header += "\tGEN"
			}
			fmt.Fprintln(tw, header)
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s", r.Group, r.Topic, r.Partition, orDash(r.NextOffset),
					orDash(r.HighWatermark), orDash(r.Lag), textOrDash(r.ConsumerID), textOrDash(r.Host), textOrDash(r.ClientID),
					secondsText(r.LagSeconds), drainText(r), r.OwnerEpoch, r.State)
				if byGen {
					fmt.Fprintf(tw, "\t%s", genText(r))
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
					if byGen {
						where = r.Group + " " + where
					}
					fmt.Fprintf(stdout, "%s %s since %s (member %s): %s\n", where, state,
						r.Since.UTC().Format(time.RFC3339), r.Member, oneLine(r.Reason))
				}
			}
			return nil
		})
}

// statusKafka is what status asks the brokers; bounds is nil when they
// were not asked or did not answer, and then nothing else is asked.
type statusKafka struct {
	stderr io.Writer
	cl     *kgo.Client
	adm    *kadm.Client
	topics []string
	bounds map[sinks.TP]logBounds
}

// open connects to --brokers and lists the topics' log bounds; brokers
// that do not answer within statusKafkaTimeout are said to be so, once,
// and the rest is shown without them.
func (k *statusKafka) open(ctx context.Context, c *common, topics []string) (func(), error) {
	kcfg, err := c.kafkaConfig(nil, nil)
	if err != nil {
		return nil, err
	}
	cl, err := kafkaclient.New(kcfg)
	if err != nil {
		return nil, fmt.Errorf("--brokers: %w", err)
	}
	k.cl, k.adm, k.topics = cl, kadm.NewClient(cl), topics
	lctx, cancel := context.WithTimeout(ctx, statusKafkaTimeout)
	defer cancel()
	bounds, err := listBounds(lctx, k.adm, topics...)
	if err != nil {
		// Brokers that answer and refuse the credentials or the
		// certificate are a command line to correct, not an outage.
		var verr *tls.CertificateVerificationError
		if ctx.Err() != nil || errors.Is(err, kerr.SaslAuthenticationFailed) || errors.As(err, &verr) {
			cl.Close()
			return nil, err
		}
		fmt.Fprintf(k.stderr, "Kafka at --brokers %s did not answer (%v): showing the stored offsets without the log's bounds, lag and group members\n", c.brokers, err)
		return cl.Close, nil
	}
	k.bounds = bounds
	return cl.Close, nil
}

// members returns the member each partition of group is assigned to;
// none when the brokers were not asked or the group is not described.
func (k *statusKafka) members(ctx context.Context, group string) map[sinks.TP]kafkaclient.GroupMember {
	out := map[sinks.TP]kafkaclient.GroupMember{}
	if k.bounds == nil {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, statusKafkaTimeout)
	defer cancel()
	ms, _, err := kafkaclient.GroupMembers(ctx, k.cl, group)
	if err != nil {
		fmt.Fprintf(k.stderr, "consumer group %s: %v: its members are not shown\n", group, err)
		return out
	}
	for _, m := range ms {
		m.Assigned.Each(func(t string, p int32) { out[sinks.TP{Topic: t, Partition: p}] = m })
	}
	return out
}

// lagSeconds fills in each row's lag age: 0 without lag, else the age of
// the record at the stored offset, fetched from the brokers; when that
// record is gone, the time since the member said the partition halted.
func (k *statusKafka) lagSeconds(ctx context.Context, rows []partitionStatus) {
	if k.bounds == nil {
		return
	}
	now := time.Now()
	byGroup := map[string]map[string]map[int32]int64{}
	for i := range rows {
		r := &rows[i]
		switch {
		case r.Lag == nil:
		case *r.Lag == 0:
			zero := 0.0
			r.LagSeconds = &zero
		default:
			if byGroup[r.Group] == nil {
				byGroup[r.Group] = map[string]map[int32]int64{}
			}
			if byGroup[r.Group][r.Topic] == nil {
				byGroup[r.Group][r.Topic] = map[int32]int64{}
			}
			byGroup[r.Group][r.Topic][r.Partition] = *r.NextOffset
		}
	}
	times := map[string]map[string]map[int32]time.Time{}
	for g, at := range byGroup {
		fctx, cancel := context.WithTimeout(ctx, statusKafkaTimeout)
		times[g], _ = kafkaclient.RecordTimes(fctx, k.cl, at) // none: the age is not shown
		cancel()
	}
	for i := range rows {
		r := &rows[i]
		if r.Lag == nil || *r.Lag == 0 {
			continue
		}
		if ts, ok := times[r.Group][r.Topic][r.Partition]; ok {
			age := max(0, now.Sub(ts).Seconds())
			r.LagSeconds = &age
		} else if r.State == sinks.PartitionHalted && r.Since != nil {
			age := max(0, now.Sub(*r.Since).Seconds())
			r.LagSeconds = &age
		}
	}
}

// drain estimates, per group and topic, when the backlog drains: it
// reads the stored offsets and the log ends again after sample, and
// divides the backlog by how much faster the stored offsets moved than
// the log ends. Without a backlog there is nothing to wait for.
func (k *statusKafka) drain(ctx context.Context, pool *pgxpool.Pool, rows []partitionStatus, sample time.Duration) error {
	if k.bounds == nil || sample == 0 {
		return nil
	}
	type key struct{ group, topic string }
	backlog := map[key]int64{}
	for _, r := range rows {
		if r.Lag != nil {
			backlog[key{r.Group, r.Topic}] += *r.Lag
		}
	}
	estimate := map[key]float64{}
	busy := false
	for kk, b := range backlog {
		if b == 0 {
			estimate[kk] = 0
		} else {
			busy = true
		}
	}
	if busy {
		began := time.Now()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sample):
		}
		lctx, cancel := context.WithTimeout(ctx, statusKafkaTimeout)
		ends, err := k.adm.ListEndOffsets(lctx, k.topics...)
		cancel()
		if err == nil {
			dt := time.Since(began).Seconds()
			arrived, completed, later := map[key]int64{}, map[key]int64{}, map[key]int64{}
			stored := map[string]map[sinks.TP]*int64{}
			for _, r := range rows {
				kk := key{r.Group, r.Topic}
				if r.Lag == nil || backlog[kk] == 0 {
					continue
				}
				if stored[r.Group] == nil {
					ss, err := postgres.NewOffsets(pool, r.Group).List(ctx)
					if err != nil {
						return err
					}
					stored[r.Group] = map[sinks.TP]*int64{}
					for _, s := range ss {
						stored[r.Group][s.TP] = s.NextOffset
					}
				}
				tp := sinks.TP{Topic: r.Topic, Partition: r.Partition}
				end, ok := ends.Lookup(r.Topic, r.Partition)
				next := stored[r.Group][tp]
				if !ok || end.Err != nil || next == nil {
					continue
				}
				arrived[kk] += end.Offset - *r.HighWatermark
				completed[kk] += *next - *r.NextOffset
				later[kk] += max(0, end.Offset-*next)
			}
			for kk, b := range backlog {
				if b > 0 {
					estimate[kk] = projector.DrainSeconds(later[kk], float64(arrived[kk])/dt, float64(completed[kk])/dt)
				}
			}
		}
	}
	for i := range rows {
		r := &rows[i]
		if s, ok := estimate[key{r.Group, r.Topic}]; ok {
			if math.IsInf(s, 1) {
				r.NeverDrains = true
			} else {
				r.DrainSeconds = &s
			}
		}
	}
	return nil
}

func compareTP(a, b sinks.TP) int {
	if c := strings.Compare(a.Topic, b.Topic); c != 0 {
		return c
	}
	return cmp.Compare(a.Partition, b.Partition)
}

func textOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// secondsText is an age in whole seconds, "-" when unknown.
func secondsText(s *float64) string {
	if s == nil {
		return "-"
	}
	return strconv.FormatFloat(math.Round(*s), 'f', 0, 64)
}

// drainText is the DRAIN column: a duration, "never" while records arrive
// as fast as they are applied, "-" when not estimated.
func drainText(r partitionStatus) string {
	switch {
	case r.NeverDrains:
		return "never"
	case r.DrainSeconds == nil:
		return "-"
	default:
		return (time.Duration(math.Round(*r.DrainSeconds)) * time.Second).String()
	}
}

// genText is a row's generation for the table: its number, and
// "(building)" for a generation being built.
func genText(r partitionStatus) string {
	if r.GenerationState == rebuild.Building {
		return fmt.Sprintf("%d(building)", r.Generation)
	}
	return strconv.Itoa(r.Generation)
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
