package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/embedded"
	"github.com/projector-dev/projector/internal/kafkaclient"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks/postgres"
)

type demoFlags struct {
	databaseURL string
	schema      string
	aggregates  int
	partitions  int
	httpAddr    string
	logLevel    string
	timeout     time.Duration
}

func demoCommand(stdout, stderr io.Writer) *ffcli.Command {
	f := &demoFlags{}
	return newCommand("demo", "projector demo [flags]",
		"Run the engine on an embedded broker and registry against real Postgres, and verify the result.", stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&f.databaseURL, "database-url", DefaultDatabaseURL, "PostgreSQL connection URL")
			fs.StringVar(&f.schema, "database-schema", "projector_demo", "Postgres schema the demo recreates and writes into")
			fs.IntVar(&f.aggregates, "aggregates", demo.DefaultOptions().Aggregates, "accounts in the generated stream (about 11 events each)")
			fs.IntVar(&f.partitions, "partitions", 6, "partitions of the demo topic")
			fs.StringVar(&f.httpAddr, "http-addr", "", "serve the first member's /metrics and /readyz here while the demo runs, e.g. 127.0.0.1:8080 for loopback only (:8080 listens on all interfaces); empty: not served")
			fs.StringVar(&f.logLevel, "log-level", "error", "log level of the members and the relay (debug, info, warn, error)")
			fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up when the members have not caught up by then")
		},
		func(ctx context.Context, _ []string) error { return runDemo(ctx, f, stdout, stderr) })
}

// member is one projector instance of the demo's group.
type member struct {
	name    string
	engine  *projector.Engine
	metrics *prometheus.Registry
	done    chan error
	cancel  context.CancelFunc
}

func runDemo(ctx context.Context, f *demoFlags, stdout, stderr io.Writer) error {
	if f.aggregates < 1 || f.partitions < 1 {
		return errors.New("--aggregates and --partitions must be at least 1")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: redact.ReplaceAttr}))
	var sayMu sync.Mutex // the progress goroutine prints too
	say := func(format string, args ...any) {
		sayMu.Lock()
		defer sayMu.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}

	pool, err := demoDatabase(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	say("postgres   %s (schema %s, recreated)", redact.String(f.databaseURL), f.schema)

	cluster, err := embedded.NewBroker(ctx, embedded.BrokerConfig{Topics: []string{demo.Topic}, Partitions: int32(f.partitions)})
	if err != nil {
		return err
	}
	defer cluster.Close()
	registry, err := embedded.NewRegistry("")
	if err != nil {
		return err
	}
	defer registry.Close()
	regClient, err := sr.NewClient(sr.URLs(registry.URL()))
	if err != nil {
		return err
	}
	say("kafka      embedded broker at %s, topic %s with %d partitions", cluster.ListenAddrs()[0], demo.Topic, f.partitions)
	say("registry   embedded at %s", registry.URL())

	enc, err := demo.RegisterSchemas(ctx, regClient)
	if err != nil {
		return err
	}
	projs, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, pool, projs...); err != nil {
		return err
	}
	opts := demo.DefaultOptions()
	opts.Aggregates = f.aggregates
	records := demo.Generate(opts)
	exp := demo.Fold(records)
	say("stream     %d records over %d accounts: %d duplicates, %d stuck behind a missing version, %d poison pills, v1 and v2 writer schemas",
		len(records), f.aggregates, exp.Stale, exp.Parked, exp.Poison)

	producer, err := kafkaclient.New(kafkaclient.Config{Brokers: cluster.ListenAddrs()}, kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer producer.Close()

	// The source service writes its changes and their events in one
	// transaction; the relay publishes the outbox.
	source, err := demo.NewSource(ctx, pool, enc)
	if err != nil {
		return err
	}
	relayClient, err := kafkaclient.New(kafkaclient.Config{Brokers: cluster.ListenAddrs()}, kgo.ProducerLinger(2*time.Millisecond))
	if err != nil {
		return err
	}
	defer relayClient.Close()
	relay, err := outbox.New(pool, outbox.Config{
		Client: relayClient, Registry: regClient, BatchSize: 2000,
		Logger: log.With("component", "relay"), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() {
		stopRelay()
		<-relayDone
	}()
	say("source     accounts service: each change and its event commit together (transactional outbox); the relay publishes them")

	const identity = "demo"
	newMember := func(name string) (*member, error) {
		m := &member{name: name, metrics: prometheus.NewRegistry(), done: make(chan error, 1)}
		reader := enc.ReaderSchema()
		var err error
		m.engine, err = projector.New(projector.Config{
			Brokers:     cluster.ListenAddrs(),
			Identity:    identity,
			Projections: projs,
			Partition:   partition.Config{BatchMaxRecords: 2000},
			Logger:      log.With("member", name),
			Registerer:  m.metrics,
			Store:       postgres.NewStore(pool),
		}, func(p *projection.Projection) partition.Decoder {
			return schemas.NewDecoder(regClient, schemas.Prune(reader, p.ReadFields()), projector.DecodeOptions(p)...)
		})
		if err != nil {
			return nil, err
		}
		mctx, cancel := context.WithCancel(ctx)
		m.cancel = cancel
		if name == "member-1" && f.httpAddr != "" {
			go func() { m.done <- serve(mctx, log, f.httpAddr, m.metrics, m.engine.Ready, m.engine.Live, m.engine.Run) }()
		} else {
			go func() { m.done <- m.engine.Run(mctx) }()
		}
		return m, nil
	}
	var members []*member
	stopAll := func() error {
		var errs []error
		for _, m := range members {
			m.cancel()
			errs = append(errs, <-m.done)
		}
		members = nil
		return errors.Join(errs...)
	}
	defer stopAll() //nolint:errcheck // the error path already reports

	start := time.Now()
	var (
		produced   int
		producedMu sync.Mutex
	)
	progressDone := make(chan struct{})
	progressStopped := make(chan struct{})
	go func() {
		defer close(progressStopped)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-t.C:
			}
			producedMu.Lock()
			p := produced
			producedMu.Unlock()
			pending, _ := demo.Pending(ctx, pool)
			committed, _, _ := demo.Committed(ctx, pool, identity, demo.Topic, nil)
			el := time.Since(start).Seconds()
			say("progress   %5.1fs  source %d/%d  outbox pending %d  committed %d  %.0f records/s",
				el, p, len(records), pending, committed, float64(committed)/el)
		}
	}()
	stopProgress := func() {
		select {
		case <-progressDone:
		default:
			close(progressDone)
			<-progressStopped
		}
	}
	defer stopProgress()
	m1, err := newMember("member-1")
	if err != nil {
		return err
	}
	members = append(members, m1)
	say("member-1   joined group %q", identity)

	// The source produces (through the outbox and relay; duplicates and
	// poison pills straight to the topic) while member-1 consumes;
	// member-2 joins a third of the way in, which rebalances the group
	// mid-stream.
	var (
		joinOnce sync.Once
		joinErr  = make(chan error, 1)
	)
	prodErr := make(chan error, 1)
	go func() {
		prodErr <- source.Run(ctx, producer, records, func(done int) {
			producedMu.Lock()
			produced = done
			producedMu.Unlock()
			if done >= len(records)/3 {
				joinOnce.Do(func() {
					m2, err := newMember("member-2")
					if err == nil {
						members = append(members, m2)
						say("member-2   joined group %q at %.1fs, a third of the way in (%d of %d records sent)",
							identity, time.Since(start).Seconds(), done, len(records))
					}
					joinErr <- err
				})
			}
		})
	}()
	if err := <-prodErr; err != nil {
		return err
	}
	if err := <-joinErr; err != nil {
		return err
	}
	if err := waitPublished(ctx, pool, f.timeout); err != nil {
		return err
	}
	published := time.Since(start)
	say("relay      every outbox row published after %.1fs", published.Seconds())
	end, err := demo.EndOffsets(ctx, kadm.NewClient(producer), demo.Topic)
	if err != nil {
		return err
	}

	wctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	err = demo.WaitCommitted(wctx, pool, identity, demo.Topic, end, nil)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	stopProgress()
	gathered := []prometheus.Gatherer{}
	for _, m := range members {
		gathered = append(gathered, m.metrics)
	}
	if err := stopAll(); err != nil {
		return fmt.Errorf("stop members: %w", err)
	}

	sum := func(name string, labels map[string]string) float64 { return sumMetric(gathered, name, labels) }
	applied := sum("projector_records_processed_total", map[string]string{"outcome": "applied"})
	stale := sum("projector_records_processed_total", map[string]string{"outcome": "stale"})
	parked := sum("projector_records_processed_total", map[string]string{"outcome": "parked"})
	dead := sum("projector_records_processed_total", map[string]string{"outcome": "dead_lettered"})
	rebalances := sum("projector_rebalances_total", nil)
	say("")
	say("summary    %d records in %.1fs: %.0f records/s end to end (source transactions, relay, fetch, decode, gate, commit);",
		len(records), elapsed.Seconds(), float64(len(records))/elapsed.Seconds())
	say("           the projector caught up %.1fs after the relay published the last event", (elapsed - published).Seconds())
	say("           applied on arrival %.0f, stale %.0f, parked %.0f (of which %d still wait for a missing version), dead-lettered %.0f",
		applied, stale, parked, exp.Parked, dead)
	say("           rebalances seen by the members: %.0f", rebalances)

	verr := demo.Verify(ctx, pool, demo.Table, exp)
	var checks []error
	if verr != nil {
		checks = append(checks, verr)
	}
	var nParked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked`).Scan(&nParked); err != nil {
		return err
	}
	nDead, err := deadletters.Count(ctx, pool, deadletters.Filter{})
	if err != nil {
		return err
	}
	if nParked != exp.Parked {
		checks = append(checks, fmt.Errorf("parked events: %d stored, the reference fold says %d", nParked, exp.Parked))
	}
	if nDead != int64(exp.Poison) {
		checks = append(checks, fmt.Errorf("dead letters: %d stored, %d poison pills were produced", nDead, exp.Poison))
	}
	if int(stale) != exp.Stale {
		checks = append(checks, fmt.Errorf("stale records: %.0f counted, the reference fold says %d", stale, exp.Stale))
	}
	if int(applied+parked) != exp.Applied+exp.Parked {
		checks = append(checks, fmt.Errorf("applied+parked records: %.0f counted, the reference fold says %d", applied+parked, exp.Applied+exp.Parked))
	}
	if err := errors.Join(checks...); err != nil {
		say("verify     FAILED")
		return err
	}
	say("verify     OK: table %s.%s equals the reference fold (%d accounts, %d closed), %d parked, %d dead letters",
		f.schema, demo.Table, len(exp.Accounts), exp.Deleted, nParked, nDead)
	// The members are gone, their offsets and dead letters stay: say
	// how to look at them, with the schema in the URL, since every
	// command reads its tables through search_path.
	dbURL := shellQuote(redact.String(withSearchPath(f.databaseURL, f.schema)))
	say("")
	say("next       the members' identity is %q; their offsets, dead letters and table stay in schema %s:", identity, f.schema)
	say("           projector status --identity %s --database-url %s", identity, dbURL)
	say("           projector dlq list --database-url %s", dbURL)
	say("           psql %s -c 'TABLE %s LIMIT 5'", dbURL, demo.Table)
	return nil
}

// withSearchPath returns the connection string raw with schema first in
// its search path, as the server's options parameter, which psql reads
// as well as projector (a search_path parameter is pgx's alone).
func withSearchPath(raw, schema string) string {
	opt := "-csearch_path=" + schema
	if u, err := url.Parse(raw); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Del("search_path")
		// A search path the options already set gives way to schema's.
		var keep []string
		for _, o := range strings.Fields(q.Get("options")) {
			if !strings.HasPrefix(o, "-csearch_path=") {
				keep = append(keep, o)
			}
		}
		opt = strings.Join(append(keep, opt), " ")
		q.Set("options", opt)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return raw + " options='" + opt + "'" // the schema is a plain identifier
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// demoMark is the comment the demo puts on the schema it creates. It only
// ever drops a schema carrying it, so that --database-schema naming a schema of
// another application is refused instead of emptied.
const demoMark = "projector demo: created by `projector demo`, which drops and recreates it on every run"

// demoDatabase recreates the demo's schema and returns a pool that writes
// into it. It drops only a schema the demo created (one carrying
// demoMark), never public or a system schema, and refuses any other
// existing schema.
func demoDatabase(ctx context.Context, f *demoFlags) (*pgxpool.Pool, error) {
	if !identLike(f.schema) {
		return nil, fmt.Errorf("--database-schema %q: want a plain lower-case identifier", f.schema)
	}
	if f.schema == "public" || f.schema == "information_schema" || strings.HasPrefix(f.schema, "pg_") {
		return nil, fmt.Errorf("--database-schema %s: the demo drops and recreates its schema, so it never uses %s; pick a schema of its own, e.g. projector_demo", f.schema, f.schema)
	}
	admin, err := connect(ctx, dbSource{url: f.databaseURL})
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		var mark *string
		err := tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, f.schema).Scan(&mark)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("look up schema %s: %w", f.schema, err)
		case mark == nil || *mark != demoMark:
			return fmt.Errorf("--database-schema %s: the schema exists and was not created by projector demo, so the demo will not drop it; "+
				"pick another --database-schema (the default is projector_demo), or drop it yourself if it is the demo's", f.schema)
		default:
			if _, err := tx.Exec(ctx, "DROP SCHEMA "+f.schema+" CASCADE"); err != nil {
				return fmt.Errorf("drop the previous demo's schema %s: %w", f.schema, err)
			}
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+f.schema); err != nil {
			return fmt.Errorf("create schema %s: %w", f.schema, err)
		}
		if _, err := tx.Exec(ctx, "COMMENT ON SCHEMA "+f.schema+" IS "+quoteLiteral(demoMark)); err != nil {
			return fmt.Errorf("mark schema %s as the demo's: %w", f.schema, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connectWith(ctx, dbSource{url: f.databaseURL}, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["search_path"] = f.schema
	})
}

// quoteLiteral quotes s as a SQL string literal (COMMENT takes no
// parameters).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func identLike(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// sumMetric adds up every sample of a counter or gauge family whose labels
// include the given ones.
func sumMetric(gs []prometheus.Gatherer, name string, labels map[string]string) float64 {
	var total float64
	for _, g := range gs {
		mfs, err := g.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if matches(m, labels) {
					total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return total
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// waitPublished polls until the relay has published every outbox row.
func waitPublished(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		n, err := demo.Pending(ctx, pool)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the relay did not publish the outbox: %d rows pending (%v)", n, err)
		case <-t.C:
		}
	}
}
