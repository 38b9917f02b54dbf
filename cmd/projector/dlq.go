package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/dlqpublish"
	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/rebuild"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
)

const timeFormat = "2006-01-02T15:04:05Z07:00"

func dlqCommand(stdout, stderr io.Writer) *ffcli.Command {
	return &ffcli.Command{
		Name:       "dlq",
		ShortUsage: "projector dlq <list|show|redrive|replay|purge|audit> [flags]",
		ShortHelp:  "Inspect, redrive, replay and purge dead letters.",
		Subcommands: []*ffcli.Command{
			dlqListCommand(stdout, stderr),
			dlqShowCommand(stdout, stderr),
			dlqRedriveCommand(stdout, stderr),
			dlqReplayCommand(stdout, stderr),
			dlqPurgeCommand(stdout, stderr),
			dlqAuditCommand(stdout, stderr),
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}

// dlqFilters are the flags that select dead letters.
type dlqFilters struct {
	identity, projection, topic, key, errorClass, status, since, until string
	limit                                                              int
}

func (d *dlqFilters) register(fs *flag.FlagSet, limit int, limitHelp string) {
	fs.StringVar(&d.identity, "identity", "", "only this consumer identity and those of its rebuilt projections' live generations and generations being built; empty: all")
	fs.StringVar(&d.projection, "projection", "", "only this projection")
	fs.StringVar(&d.topic, "topic", "", "only this source topic")
	fs.StringVar(&d.key, "key", "", "only records with exactly this key")
	fs.StringVar(&d.errorClass, "error-class", "", "only this error class: "+strings.Join(sinks.Classes, ", ")+"; empty: any")
	fs.StringVar(&d.status, "status", "", "only this status: "+strings.Join(deadletters.Statuses, ", ")+"; empty: any")
	fs.StringVar(&d.since, "since", "", "only entries first seen at or after this RFC3339 time, or this long ago (24h, 7d)")
	fs.StringVar(&d.until, "until", "", "only entries first seen before this RFC3339 time, or this long ago (24h, 7d)")
	fs.IntVar(&d.limit, "limit", limit, limitHelp)
}

// filter turns the flags into a filter, naming the flag that is wrong.
func (d *dlqFilters) filter(now time.Time) (deadletters.Filter, error) {
	f := deadletters.Filter{
		Identity: d.identity, Projection: d.projection, Topic: d.topic, Key: d.key,
		ErrorClass: d.errorClass, Status: d.status, Limit: d.limit,
	}
	if d.status != "" && !deadletters.ValidStatus(d.status) {
		return f, fmt.Errorf("--status %q: want one of %s", d.status, strings.Join(deadletters.Statuses, ", "))
	}
	if d.errorClass != "" && !slices.Contains(sinks.Classes, d.errorClass) {
		return f, fmt.Errorf("--error-class %q: want one of %s", d.errorClass, strings.Join(sinks.Classes, ", "))
	}
	if d.limit < 0 {
		return f, fmt.Errorf("--limit %d: must not be negative", d.limit)
	}
	var err error
	if f.Since, err = parseWhen("--since", d.since, now); err != nil {
		return f, err
	}
	if f.Until, err = parseWhen("--until", d.until, now); err != nil {
		return f, err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, fmt.Errorf("--since %s is not before --until %s", f.Since.Format(timeFormat), f.Until.Format(timeFormat))
	}
	return f, nil
}

// withGenerations widens f's identity to the identities of its live and
// generations being built (see rebuild.Store.DeadLetterFilter).
func withGenerations(ctx context.Context, pool *pgxpool.Pool, f deadletters.Filter) (deadletters.Filter, error) {
	return rebuild.NewStore(pool).DeadLetterFilter(ctx, f)
}

// parseWhen reads an RFC3339 time or a duration meaning that long before
// now (Go durations, plus whole days such as 7d).
func parseWhen(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return time.Time{}, fmt.Errorf("%s %q: want an RFC3339 time (2006-01-02T15:04:05Z) or a duration such as 24h or 7d", name, s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d < 0 {
			return time.Time{}, fmt.Errorf("%s %q: want an RFC3339 time (2006-01-02T15:04:05Z) or a duration such as 24h or 7d", name, s)
		}
	}
	return now.Add(-d), nil
}

// idList is a repeatable --id flag (also comma-separated).
type idList []int64

func (l *idList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, id := range *l {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}

func (l *idList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("%q is not a dead-letter id", part)
		}
		*l = append(*l, id)
	}
	return nil
}

func defaultActor() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "unknown"
}

func dlqListCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		filters dlqFilters
		asJSON  bool
	)
	return newCommand("list", "projector dlq list [flags]", "List dead letters, oldest first.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url")
			filters.register(fs, 1000, "most entries to print; 0: no limit")
			fs.BoolVar(&asJSON, "json", false, "print a JSON array")
		},
		func(ctx context.Context, _ []string) error {
			f, err := filters.filter(time.Now())
			if err != nil {
				return err
			}
			if f.Limit == 0 {
				f.Limit = math.MaxInt32
			}
			pool, err := connectEngine(ctx, c.database(), tableDeadLetters)
			if err != nil {
				return err
			}
			defer pool.Close()
			if f, err = withGenerations(ctx, pool, f); err != nil {
				return err
			}
			dls, err := deadletters.List(ctx, pool, f)
			if err != nil {
				return err
			}
			for i := range dls {
				dls[i].Error = redact.String(dls[i].Error)
			}
			if asJSON {
				if dls == nil {
					dls = []deadletters.Entry{}
				}
				return writeJSON(stdout, dls)
			}
			// Dead letters of several identities (a rebuilt projection's
			// generations have their own) say whose they are.
			identities := map[string]bool{}
			for _, d := range dls {
				identities[d.Identity] = true
			}
			byIdentity := len(identities) > 1
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			if byIdentity {
				fmt.Fprint(tw, "ID\tIDENTITY")
			} else {
				fmt.Fprint(tw, "ID")
			}
			fmt.Fprintln(tw, "\tPROJECTION\tTOPIC\tPARTITION\tOFFSET\tKEY\tSTATUS\tCLASS\tATTEMPTS\tFIRST-SEEN\tERROR")
			for _, d := range dls {
				if byIdentity {
					fmt.Fprintf(tw, "%d\t%s", d.ID, d.Identity)
				} else {
					fmt.Fprintf(tw, "%d", d.ID)
				}
				fmt.Fprintf(tw, "\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Projection, d.Topic, d.Partition, d.Offset,
					keyText(d), d.Status, d.ErrorClass, d.Attempts, d.FirstSeen.Format(timeFormat), errorText(d.Error))
			}
			return tw.Flush()
		})
}

func dlqShowCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		asJSON bool
		full   bool
		fset   *flag.FlagSet
	)
	return newCommand("show", "projector dlq show ID [flags]",
		"Show one dead letter: every field, its headers, and its value decoded through the Schema Registry when --registry-url is set.", stderr,
		func(fs *flag.FlagSet) {
			fset = fs
			c.register(fs, "database-url", "registry-url")
			fs.BoolVar(&asJSON, "json", false, "print a JSON object, with the key, value and error whole")
			fs.BoolVar(&full, "full", false, "print the key, value and error whole; without it, text quotes the first "+strconv.Itoa(redact.MaxQuoted)+" bytes of each and says how long the whole is")
		},
		func(ctx context.Context, args []string) error {
			// Flags may follow the ID: parsing stopped at it.
			for i := 0; i < len(args)-1; i++ {
				if err := fset.Parse(args[i+1:]); err != nil {
					return err
				}
				args = append(args[:i+1:i+1], fset.Args()...)
			}
			if len(args) != 1 {
				return &usageError{msg: "dlq show: want exactly one argument, the dead-letter ID (see projector dlq list)"}
			}
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return &usageError{msg: fmt.Sprintf("dlq show: ID %q is not a dead-letter id", args[0])}
			}
			pool, err := connectEngine(ctx, c.database(), tableDeadLetters)
			if err != nil {
				return err
			}
			defer pool.Close()
			d, err := deadletters.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			v := showDeadLetter(d)
			v.decode(ctx, &c)
			if asJSON {
				return writeJSON(stdout, v)
			}
			return v.writeText(stdout, full)
		})
}

// shownHeader is a header as `dlq show` prints it: its value as text when
// it is valid UTF-8, else base64.
type shownHeader struct {
	Key      string  `json:"key"`
	Value    *string `json:"value"` // nil: a null header value
	Encoding string  `json:"encoding"`
}

// shownDeadLetter is what `dlq show --json` prints: the dead letter (value
// in base64) with readable headers and, when it decoded, the value as
// JSON, else why not.
type shownDeadLetter struct {
	deadletters.Entry
	Headers       []shownHeader   `json:"headers"`
	DecodedValue  json.RawMessage `json:"decoded_value,omitempty"`
	ValueSchemaID *int            `json:"value_schema_id,omitempty"`
	DecodeError   string          `json:"decode_error,omitempty"`
}

func showDeadLetter(d deadletters.Entry) *shownDeadLetter {
	// The error was written by the engine, possibly quoting a URL with
	// credentials (a registry or repair source): it is shown masked.
	d.Error = redact.String(d.Error)
	v := &shownDeadLetter{Entry: d, Headers: make([]shownHeader, len(d.Headers))}
	for i, h := range d.Headers {
		v.Headers[i] = shownHeader{Key: h.Key, Encoding: "text"}
		if h.Value == nil {
			continue
		}
		s, enc := bytesText(h.Value)
		v.Headers[i].Value, v.Headers[i].Encoding = &s, enc
	}
	return v
}

// decode decodes the value through the registry of c, or says why not.
func (v *shownDeadLetter) decode(ctx context.Context, c *common) {
	switch {
	case c.registryURL == "":
		v.DecodeError = "no --registry-url given"
		return
	case v.Value == nil:
		v.DecodeError = "the record has no value"
		return
	}
	cl, err := c.registryClient()
	if err != nil {
		v.DecodeError = redact.String(err.Error())
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rec, id, err := schemas.NewDecoder(cl, nil).Decode(dctx, v.Value)
	if err != nil {
		v.DecodeError = redact.String(err.Error())
		return
	}
	js, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		v.DecodeError = fmt.Sprintf("schema id %d: decoded, but not representable as JSON: %v", id, err)
		return
	}
	v.DecodedValue, v.ValueSchemaID = js, &id
}

// writeText prints v for people; unless full, it quotes at most
// redact.MaxQuoted bytes of the key, the error and the value (see
// redact.Clip).
func (v *shownDeadLetter) writeText(w io.Writer, full bool) error {
	bound := redact.Clip
	if full {
		bound = func(s string) string { return s }
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	d := v.Entry
	field := func(name string, value any) { fmt.Fprintf(tw, "%s\t%v\n", name, value) }
	field("id", d.ID)
	field("identity", d.Identity)
	field("projection", d.Projection)
	field("topic", d.Topic)
	field("partition", d.Partition)
	field("offset", d.Offset)
	field("key", keyTextBound(d, bound))
	field("record time", timeOrDash(d.RecordTime))
	field("status", d.Status)
	field("error class", d.ErrorClass)
	field("error", oneLine(bound(d.Error)))
	field("schema id", intOrDash(d.SchemaID))
	field("trace id", orDashString(d.TraceID))
	field("attempts", d.Attempts)
	field("replays", d.Replays)
	field("first seen", d.FirstSeen.Format(timeFormat))
	field("last seen", d.LastSeen.Format(timeFormat))
	field("replayed at", timeOrDash(d.ReplayedAt))
	field("resolved at", timeOrDash(d.ResolvedAt))
	if len(v.Headers) == 0 {
		field("headers", "(none)")
	} else {
		field("headers", len(v.Headers))
		for _, h := range v.Headers {
			switch {
			case h.Value == nil:
				fmt.Fprintf(tw, "  %s\t(null)\n", h.Key)
			case h.Encoding == "base64":
				fmt.Fprintf(tw, "  %s\t(base64) %s\n", h.Key, bound(*h.Value))
			default:
				fmt.Fprintf(tw, "  %s\t%s\n", h.Key, oneLine(bound(*h.Value)))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case v.DecodedValue != nil:
		_, err := fmt.Fprintf(w, "value (decoded, schema id %d):\n%s\n", *v.ValueSchemaID, bound(string(v.DecodedValue)))
		return err
	case v.Value == nil:
		_, err := fmt.Fprintln(w, "value: (null)")
		return err
	default:
		_, err := fmt.Fprintf(w, "value (base64, %d bytes; not decoded: %s):\n%s\n", len(v.Value), v.DecodeError, bound(base64.StdEncoding.EncodeToString(v.Value)))
		return err
	}
}

func dlqReplayCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		filters dlqFilters
		ids     idList
		dryRun  bool
		execute bool
		perSec  float64
		actor   string
		fset    *flag.FlagSet
	)
	return newCommand("replay", "projector dlq replay (--id N ... | filters) [--execute] [flags]",
		"Publish dead letters again to their original topic, with the header "+sinks.ReplayHeader+", where every consumer group of the topic sees them again. "+
			"dlq redrive, which applies them through the worker that owns their partition and publishes nothing, is the default way to retry them. A dry run unless --execute.", stderr,
		func(fs *flag.FlagSet) {
			fset = fs
			c.register(fs, "database-url", "brokers")
			filters.register(fs, 0, "most entries to replay, oldest first; 0: no limit")
			fs.Lookup("status").Usage = "only this status: " + strings.Join(deadletters.Statuses, ", ") + "; empty: open, or any status with --id"
			fs.Var(&ids, "id", "replay this dead letter (repeatable, or comma-separated)")
			fs.BoolVar(&dryRun, "dry-run", true, "only print what would be replayed")
			fs.BoolVar(&execute, "execute", false, "produce the records (the same as --dry-run=false)")
			fs.Float64Var(&perSec, "rate", 10, "most records to produce per second")
			fs.StringVar(&actor, "actor", defaultActor(), "who replays, for the audit log (default: $USER)")
		},
		func(ctx context.Context, _ []string) error {
			var err error
			if dryRun, err = dryRunOf(fset, dryRun, execute); err != nil {
				return err
			}
			if perSec <= 0 || math.IsInf(perSec, 0) || math.IsNaN(perSec) {
				return fmt.Errorf("--rate %v: must be a positive number of records per second", perSec)
			}
			if actor == "" {
				return errors.New("--actor must not be empty")
			}
			f, err := filters.filter(time.Now())
			if err != nil {
				return err
			}
			if len(ids) > 0 {
				f.IDs = slices.Clone(ids)
			} else if f.Status == "" {
				f.Status = deadletters.StatusOpen
			}
			var kcfg kafkaclient.Config
			if !dryRun {
				if kcfg, err = c.kafkaConfig(nil, nil); err != nil {
					return err
				}
			}
			pool, err := connectEngine(ctx, c.database(), tableDeadLetters, tableDLQAudit)
			if err != nil {
				return err
			}
			defer pool.Close()
			entries, err := selectDeadLetters(ctx, pool, f, ids)
			if err != nil {
				return err
			}
			var purged []string
			for _, d := range entries {
				if d.Status == deadletters.StatusPurged {
					purged = append(purged, strconv.FormatInt(d.ID, 10))
				}
			}
			if len(purged) > 0 {
				return fmt.Errorf("refusing to replay purged dead letters (%s): purged entries are never replayed", strings.Join(purged, ", "))
			}
			if len(entries) == 0 {
				fmt.Fprintln(stdout, "no dead letters match: nothing to replay")
				return nil
			}
			if dryRun {
				fmt.Fprintf(stdout, "dry run: would replay %d dead letters (add --execute to produce them):\n", len(entries))
				tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tTOPIC\tPARTITION\tOFFSET\tKEY\tERROR")
				for _, d := range entries {
					fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Topic, d.Partition, d.Offset, keyText(d), errorText(redact.String(d.Error)))
				}
				return tw.Flush()
			}
			cl, err := kafkaclient.New(kcfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				return fmt.Errorf("--brokers: %w", err)
			}
			defer cl.Close()
			n, replayErr := dlqpublish.Replay(ctx, pool, cl, entries, perSec)
			var auditErr error
			if n > 0 {
				done := make([]int64, n)
				for i := range done {
					done[i] = entries[i].ID
				}
				actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				auditErr = deadletters.AuditAs(actx, pool, deadletters.CommandActor(actor), deadletters.AuditReplay, f, done,
					fmt.Sprintf("produced %d of %d at most %v per second", n, len(entries), perSec))
				cancel()
			}
			fmt.Fprintf(stdout, "replayed %d of %d dead letters\n", n, len(entries))
			return errors.Join(replayErr, auditErr)
		})
}

func dlqRedriveCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		filters dlqFilters
		ids     idList
		dryRun  bool
		execute bool
		actor   string
		fset    *flag.FlagSet
	)
	return newCommand("redrive", "projector dlq redrive (--id N ... | filters) [--execute] [flags]",
		"Queue dead letters for the worker that owns their partition to apply again, through the version gate, in its own transaction: "+
			"resolved when applied (or already applied), reopened when they fail again. Nothing is published. A dry run unless --execute.", stderr,
		func(fs *flag.FlagSet) {
			fset = fs
			c.register(fs, "database-url")
			filters.register(fs, deadletters.RedriveDefaultLimit,
				fmt.Sprintf("most entries to queue, oldest first (at most %d)", deadletters.RedriveMaxLimit))
			fs.Lookup("status").Usage = "only this status: " + strings.Join(deadletters.Statuses, ", ") + "; empty: open, or any status with --id"
			fs.Var(&ids, "id", "redrive this dead letter (repeatable, or comma-separated)")
			fs.BoolVar(&dryRun, "dry-run", true, "only print what would be queued")
			fs.BoolVar(&execute, "execute", false, "queue them (the same as --dry-run=false)")
			fs.StringVar(&actor, "actor", defaultActor(), "who redrives, for the audit log, beside the operating-system and database users it records (default: $USER)")
		},
		func(ctx context.Context, _ []string) error {
			var err error
			if dryRun, err = dryRunOf(fset, dryRun, execute); err != nil {
				return err
			}
			if actor == "" {
				return errors.New("--actor must not be empty")
			}
			if filters.limit < 1 || filters.limit > deadletters.RedriveMaxLimit {
				return fmt.Errorf("--limit %d: must be between 1 and %d", filters.limit, deadletters.RedriveMaxLimit)
			}
			if len(ids) > deadletters.RedriveMaxLimit {
				return fmt.Errorf("--id: %d dead letters, at most %d in one request", len(ids), deadletters.RedriveMaxLimit)
			}
			f, err := filters.filter(time.Now())
			if err != nil {
				return err
			}
			if len(ids) > 0 {
				f.IDs = slices.Clone(ids)
				f.Limit = max(f.Limit, len(ids))
			} else if f.Status == "" {
				f.Status = deadletters.StatusOpen
			}
			pool, err := connectEngine(ctx, c.database(), tableDeadLetters, tableDLQAudit, tableRedrives)
			if err != nil {
				return err
			}
			defer pool.Close()
			entries, err := selectDeadLetters(ctx, pool, f, ids)
			if err != nil {
				return err
			}
			var chosen []int64
			var left []string
			for _, d := range entries {
				if d.Status == deadletters.StatusOpen || d.Status == deadletters.StatusReplayed {
					chosen = append(chosen, d.ID)
				} else {
					left = append(left, fmt.Sprintf("%d (%s)", d.ID, d.Status))
				}
			}
			if len(left) > 0 {
				fmt.Fprintf(stdout, "left alone, neither open nor replayed: %s\n", strings.Join(left, ", "))
			}
			if len(chosen) == 0 {
				fmt.Fprintln(stdout, "no open or replayed dead letters match: nothing to redrive")
				return nil
			}
			if dryRun {
				fmt.Fprintf(stdout, "dry run: would queue %d dead letters for the workers that own their partitions (add --execute to queue them):\n", len(chosen))
				tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tIDENTITY\tPROJECTION\tTOPIC\tPARTITION\tOFFSET\tKEY\tERROR")
				for _, d := range entries {
					if slices.Contains(chosen, d.ID) {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Identity, d.Projection, d.Topic, d.Partition, d.Offset, keyText(d), errorText(redact.String(d.Error)))
					}
				}
				return tw.Flush()
			}
			queued, err := deadletters.Redrive(ctx, pool, chosen, deadletters.CommandActor(actor), f)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "queued %d of %d dead letters for the workers that own their partitions; "+
				"projector dlq list --status queued shows those not applied yet (a partition no member runs keeps them queued)\n", len(queued), len(chosen))
			return nil
		})
}

// selectDeadLetters loads the dead letters matching f (no limit unless
// f.Limit says so). When ids were asked for, every one must exist and
// match the other filters.
func selectDeadLetters(ctx context.Context, pool *pgxpool.Pool, f deadletters.Filter, ids []int64) ([]deadletters.Entry, error) {
	if f.Limit == 0 {
		f.Limit = math.MaxInt32
	}
	f, err := withGenerations(ctx, pool, f)
	if err != nil {
		return nil, err
	}
	entries, err := deadletters.List(ctx, pool, f)
	if err != nil {
		return nil, err
	}
	if err := checkIDs(ctx, pool, ids, entries); err != nil {
		return nil, err
	}
	return entries, nil
}

// checkIDs reports ids that do not exist or that the other filters left
// out of found.
func checkIDs(ctx context.Context, pool *pgxpool.Pool, ids []int64, found []deadletters.Entry) error {
	have := map[int64]bool{}
	for _, d := range found {
		have[d.ID] = true
	}
	var unknown, filtered []string
	for _, id := range ids {
		if have[id] {
			continue
		}
		_, err := deadletters.Get(ctx, pool, id)
		switch {
		case errors.Is(err, deadletters.ErrNoDeadLetter):
			unknown = append(unknown, strconv.FormatInt(id, 10))
		case err != nil:
			return err
		default:
			filtered = append(filtered, strconv.FormatInt(id, 10))
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("--id: no dead letter with id %s", strings.Join(unknown, ", "))
	}
	if len(filtered) > 0 {
		return fmt.Errorf("--id: dead letter %s does not match the other filters (or is beyond --limit)", strings.Join(filtered, ", "))
	}
	return nil
}

func dlqPurgeCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c       common
		filters dlqFilters
		ids     idList
		yes     bool
		actor   string
	)
	return newCommand("purge", "projector dlq purge (--id N ... | filters) --yes [flags]",
		"Delete dead letters for good. Without --yes, only says how many would go.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url")
			filters.register(fs, 0, "most entries to purge, oldest first; 0: no limit")
			fs.Var(&ids, "id", "purge this dead letter (repeatable, or comma-separated)")
			fs.BoolVar(&yes, "yes", false, "really delete them")
			fs.StringVar(&actor, "actor", defaultActor(), "who purges, for the audit log (default: $USER)")
		},
		func(ctx context.Context, _ []string) error {
			if os.Getenv("PROJECTOR_YES") != "" {
				return errors.New("PROJECTOR_YES is set: purging must be confirmed with --yes on the command line; unset PROJECTOR_YES")
			}
			if actor == "" {
				return errors.New("--actor must not be empty")
			}
			f, err := filters.filter(time.Now())
			if err != nil {
				return err
			}
			if len(ids) > 0 {
				f.IDs = slices.Clone(ids)
			}
			pool, err := connectEngine(ctx, c.database(), tableDeadLetters, tableDLQAudit)
			if err != nil {
				return err
			}
			defer pool.Close()
			scoped, err := withGenerations(ctx, pool, f)
			if err != nil {
				return err
			}
			matched, err := deadletters.IDs(ctx, pool, scoped)
			if err != nil {
				return err
			}
			if len(ids) > 0 {
				found := make([]deadletters.Entry, len(matched))
				for i, id := range matched {
					found[i].ID = id
				}
				if err := checkIDs(ctx, pool, ids, found); err != nil {
					return err
				}
			}
			if len(matched) == 0 {
				fmt.Fprintln(stdout, "no dead letters match: nothing to purge")
				return nil
			}
			if !yes {
				fmt.Fprintf(stdout, "would purge %d dead letters\n", len(matched))
				return fmt.Errorf("refusing to purge %d dead letters without --yes: add --yes to delete them", len(matched))
			}
			exact := scoped
			exact.IDs, exact.Limit = matched, 0
			n, err := deadletters.Purge(ctx, pool, exact)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := deadletters.AuditAs(actx, pool, deadletters.CommandActor(actor), deadletters.AuditPurge, f, matched, fmt.Sprintf("purged %d", n)); err != nil {
				return fmt.Errorf("purged %d dead letters, but: %w", n, err)
			}
			fmt.Fprintf(stdout, "purged %d dead letters\n", n)
			return nil
		})
}

func dlqAuditCommand(stdout, stderr io.Writer) *ffcli.Command {
	var (
		c      common
		limit  int
		asJSON bool
	)
	return newCommand("audit", "projector dlq audit [flags]", "List redrives, replays and purges, newest first, with who did them: the actor given, the operating-system user and the database user.", stderr,
		func(fs *flag.FlagSet) {
			c.register(fs, "database-url")
			fs.IntVar(&limit, "limit", 100, "most entries to print; 0: all")
			fs.BoolVar(&asJSON, "json", false, "print a JSON array")
		},
		func(ctx context.Context, _ []string) error {
			if limit < 0 {
				return fmt.Errorf("--limit %d: must not be negative", limit)
			}
			pool, err := connectEngine(ctx, c.database(), tableDLQAudit)
			if err != nil {
				return err
			}
			defer pool.Close()
			entries, err := deadletters.ListAudit(ctx, pool, limit)
			if err != nil {
				return err
			}
			if asJSON {
				if entries == nil {
					entries = []deadletters.AuditEntry{}
				}
				return writeJSON(stdout, entries)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tAT\tACTOR\tOS USER\tDB USER\tACTION\tENTRIES\tFILTER\tDETAIL")
			for _, a := range entries {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.ID, a.At.Format(timeFormat), a.Actor, orDashString(a.OSUser), orDashString(a.DBUser),
					a.Action, len(a.EntryIDs), a.Filter, a.Detail)
			}
			return tw.Flush()
		})
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// bytesText is b as text when it is valid UTF-8, else in base64.
func bytesText(b []byte) (s, encoding string) {
	if utf8.Valid(b) {
		return string(b), "text"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// keyText is a record key for a table cell, at most redact.MaxQuoted
// bytes of it (see redact.Clip).
func keyText(d deadletters.Entry) string { return keyTextBound(d, redact.Clip) }

// keyTextBound is a record key as text, bounded by bound.
func keyTextBound(d deadletters.Entry, bound func(string) string) string {
	if d.KeyNull {
		return "(null)"
	}
	s, enc := bytesText([]byte(d.Key))
	if enc == "base64" {
		return "(base64) " + bound(s)
	}
	return oneLine(bound(s))
}

// errorText is a dead letter's error for a table cell: an error may quote
// the record's data, so at most a few hundred bytes of it.
func errorText(s string) string { return oneLine(redact.ClipTo(s, 4*redact.MaxQuoted)) }

// oneLine keeps a text on one line of a table.
func oneLine(s string) string {
	return strings.NewReplacer("\r", `\r`, "\n", `\n`, "\t", `\t`).Replace(s)
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(timeFormat)
}

func intOrDash(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

func orDashString(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// dryRunOf is whether a command given --dry-run and --execute only
// prints what it would do: --execute turns the dry run off, unless
// --dry-run=true was given too.
func dryRunOf(fs *flag.FlagSet, dryRun, execute bool) (bool, error) {
	if !execute {
		return dryRun, nil
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "dry-run" })
	if set && dryRun {
		return false, errors.New("--execute and --dry-run=true contradict each other: drop one")
	}
	return false, nil
}
