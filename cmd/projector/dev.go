package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/embedded"
	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// DefaultDevPartitions is how many partitions dev gives each topic.
const DefaultDevPartitions = 3

type devFlags struct {
	runFlags
	brokersAddr  string
	registryAddr string
	partitions   int
	takeOver     bool
}

func devCommand(stdout, stderr io.Writer) *ffcli.Command {
	f := &devFlags{}
	return newCommand("dev", "projector dev --config FILE [flags]",
		"Run the engine on your projections with an embedded broker and registry, for local development.", stderr,
		func(fs *flag.FlagSet) {
			f.registerEngine(fs)
			// Not run's identity: see DevIdentity.
			id := fs.Lookup("identity")
			id.DefValue, f.identity = DevIdentity, DevIdentity
			id.Usage = "consumer identity: the namespace of stored offsets, moved back to 0 on every start since the embedded topics start empty; not run's default, so that dev never moves a run's offsets. An identity with stored offsets that dev did not create is refused unless --take-over-identity"
			// Loopback unless told otherwise: see DevHTTPAddr.
			ha := fs.Lookup("http-addr")
			ha.DefValue, f.httpAddr = DevHTTPAddr, DevHTTPAddr
			ha.Usage = "address of /metrics, /livez, /readyz: loopback only; --http-addr :8080 to listen on all interfaces; empty disables"
			fs.BoolVar(&f.takeOver, "take-over-identity", false, "let --identity name an identity dev did not create (a projector run's): its stored offsets of the projection file's topics move back to 0 and its running members are fenced; asked again on every start")
			fs.StringVar(&f.brokersAddr, "brokers-addr", DevBrokers, "host:port the embedded Kafka broker listens on and advertises")
			fs.StringVar(&f.registryAddr, "registry-addr", strings.TrimPrefix(DevRegistryURL, "http://"), "host:port the embedded Schema Registry listens on")
			fs.IntVar(&f.partitions, "partitions", DefaultDevPartitions, "partitions of each topic of the projection file, created at start")
		},
		func(ctx context.Context, args []string) error { return f.run(ctx, args, stdout, stderr) })
}

// run starts the embedded broker, with the projection file's topics, and
// the registry, then runs the engine exactly as projector run does, on
// them. The registry starts empty: a projection without schema: in its
// file waits until a producer registers its topic's value schema.
func (f *devFlags) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q: dev takes only flags", args[0])
	}
	if f.partitions < 1 {
		return fmt.Errorf("--partitions %d: must be at least 1", f.partitions)
	}
	if err := f.validate(); err != nil {
		return err
	}
	projs, err := projection.Load(f.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var topics []string
	for _, p := range projs {
		if !slices.Contains(topics, p.Topic) {
			topics = append(topics, p.Topic)
		}
	}
	broker, err := embedded.NewBroker(ctx, embedded.BrokerConfig{Addr: f.brokersAddr, Topics: topics, Partitions: int32(f.partitions)})
	if err != nil {
		return fmt.Errorf("--brokers-addr: %w", err)
	}
	defer broker.Close()
	registry, err := embedded.NewRegistry(f.registryAddr)
	if err != nil {
		return fmt.Errorf("--registry-addr: %w", err)
	}
	defer registry.Close()
	reg, err := sr.NewClient(sr.URLs(registry.URL()))
	if err != nil {
		return err
	}
	brokers := broker.ListenAddrs()
	fmt.Fprintf(stdout, "projector dev: your projections on an embedded Kafka broker and Schema Registry (Ctrl-C stops)\n")
	fmt.Fprintf(stdout, "  kafka      %s, topics %s (%d partitions each)\n", brokers[0], quoteTopics(topics), f.partitions)
	fmt.Fprintf(stdout, "  registry   %s\n", registry.URL())
	return f.runOn(ctx, stderr, engineEnv{
		brokers:      brokers,
		registry:     reg,
		awaitSchemas: true,
		migrated: func(ctx context.Context, pool *pgxpool.Pool) error {
			if err := f.claimIdentity(ctx, stdout, pool); err != nil {
				return err
			}
			return f.restartOffsets(ctx, stdout, pool, topics)
		},
		running: func(target dbTarget, http net.Addr) {
			f.banner(stdout, target, http, brokers[0], registry.URL(), projs)
		},
	})
}

// devIdentitiesDDL holds the identities projector dev created, the mark
// that lets it move their stored offsets back to 0 on every start.
const devIdentitiesDDL = `CREATE TABLE IF NOT EXISTS projector_dev_identities (
	identity   text        PRIMARY KEY,
	created_at timestamptz NOT NULL DEFAULT now()
)`

// devIdentitiesLock serialises dev starts that mark identities, so that
// two creating the table at once do not collide.
const devIdentitiesLock = 0x70646576 // "pdev"

// ErrNotDevIdentity is the refusal of an --identity whose stored offsets
// dev did not write.
var ErrNotDevIdentity = errors.New("identity not created by projector dev")

// claimIdentity makes sure dev may move the identity's stored offsets. An
// identity without stored offsets is dev's from now on, and marked so; one
// with stored offsets is dev's only when marked, or when it is dev's own
// default (dev of earlier releases left it unmarked, and run never
// defaults to it). Any other is someone else's, a projector run's most
// likely: moving its offsets back to 0 and fencing its members is done
// only on --take-over-identity, and it stays unmarked, so that the next
// start asks again.
func (f *devFlags) claimIdentity(ctx context.Context, stdout io.Writer, pool *pgxpool.Pool) error {
	var foreign bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, devIdentitiesLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, devIdentitiesDDL); err != nil {
			return err
		}
		var marked, stored bool
		if err := tx.QueryRow(ctx, `SELECT
			EXISTS (SELECT FROM projector_dev_identities WHERE identity = $1),
			EXISTS (SELECT FROM projector_offsets WHERE identity = $1)`, f.identity).Scan(&marked, &stored); err != nil {
			return err
		}
		if marked {
			return nil
		}
		if stored && f.identity != DevIdentity {
			foreign = true
			return nil
		}
		_, err := tx.Exec(ctx, `INSERT INTO projector_dev_identities (identity) VALUES ($1) ON CONFLICT DO NOTHING`, f.identity)
		return err
	})
	if err != nil {
		return fmt.Errorf("mark identity %q as projector dev's: %w", f.identity, err)
	}
	switch {
	case !foreign:
		return nil
	case !f.takeOver:
		return fmt.Errorf("--identity %q: %w: it has stored offsets, of a projector run most likely, and dev moves its identity's stored offsets back to 0 on every start, fencing the identity's running members; "+
			"pick another --identity (the default %s is dev's own), or add --take-over-identity to do that to %q", f.identity, ErrNotDevIdentity, DevIdentity, f.identity)
	}
	fmt.Fprintf(stdout, "  offsets    identity %q was not created by projector dev; taken over as --take-over-identity asks: its stored offsets move back to 0 and its running members are fenced\n", f.identity)
	return nil
}

// restartOffsets moves the identity's stored offsets of the topics back to
// 0. The embedded broker keeps its log in memory, so every dev start
// begins with empty topics: an offset stored by the previous start points
// past their end and would halt its partition. The tables keep their rows
// and versions, so an event the previous start applied, produced again,
// is ignored as stale.
func (f *devFlags) restartOffsets(ctx context.Context, stdout io.Writer, pool *pgxpool.Pool, topics []string) error {
	offsets := postgres.NewOffsets(pool, f.identity)
	stored, err := offsets.List(ctx)
	if err != nil {
		return err
	}
	to := map[sinks.TP]int64{}
	for _, s := range stored {
		if slices.Contains(topics, s.Topic) && s.NextOffset != nil && *s.NextOffset > 0 {
			to[s.TP] = 0
		}
	}
	if len(to) == 0 {
		return nil
	}
	if _, err := offsets.Reset(ctx, "projector dev", "the embedded broker's topics start empty on every dev start", to); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  offsets    %d stored offsets of identity %s moved back to 0: the embedded topics start empty; the tables keep their rows\n", len(to), f.identity)
	return nil
}

// banner says where dev writes, where it serves HTTP (http, nil for
// nowhere) and the commands to type next.
func (f *devFlags) banner(w io.Writer, target dbTarget, http net.Addr, brokers, registryURL string, projs []*projection.Projection) {
	// One URL for psql, status and dlq: psql ignores pgx's search_path
	// parameter, both take the schema as a session option.
	dbURL := redact.String(f.databaseURL)
	if target.Schema != "" {
		dbURL = withSearchPath(dbURL, target.Schema)
	}
	fmt.Fprintf(w, "  postgres   %s\n", target)
	fmt.Fprintf(w, "  identity   %s\n", f.identity)
	if http != nil {
		fmt.Fprintf(w, "  http       %s\n", httpReach(http))
	}
	fmt.Fprintf(w, "running; next, in another terminal:\n")
	produceFlags := ""
	if brokers != DevBrokers || registryURL != DevRegistryURL {
		produceFlags = fmt.Sprintf(" --brokers %s --registry-url %s", brokers, registryURL)
	}
	said := map[string]bool{} // one line per topic, however many projections it feeds
	for _, p := range projs {
		if !said[p.Topic] {
			said[p.Topic] = true
			schema := "SCHEMA.avsc"
			if p.SchemaFile != "" {
				schema = shellQuote(filepath.Join(filepath.Dir(f.config), p.SchemaFile))
			}
			fmt.Fprintf(w, "  projector produce%s --topic %s --schema %s --key-field %s < events.jsonl\n", produceFlags, shellWord(p.Topic), schema, p.KeyField)
		}
	}
	for _, p := range projs {
		fmt.Fprintf(w, "  psql %s -c 'TABLE %s'\n", shellQuote(dbURL), p.Table)
	}
	fmt.Fprintf(w, "  projector status --brokers %s --database-url %s --identity %s\n", brokers, shellQuote(dbURL), f.identity)
	fmt.Fprintf(w, "  projector dlq list --database-url %s\n", shellQuote(dbURL))
}

// httpReach says where the HTTP surface bound at addr answers: from this
// machine only, or from others too.
func httpReach(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	switch {
	case ok && tcp.IP.IsLoopback():
		return fmt.Sprintf("%s: /metrics, /livez, /readyz (loopback only; --http-addr :%d to listen on all interfaces)", addr, tcp.Port)
	case ok && tcp.IP.IsUnspecified():
		return fmt.Sprintf("%s: /metrics, /livez, /readyz (all interfaces: reachable from other machines)", addr)
	}
	return fmt.Sprintf("%s: /metrics, /livez, /readyz", addr)
}

// shellWord is s as one word of a POSIX shell command: as it is when it
// holds nothing the shell reads specially, else quoted.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == "" {
		return s
	}
	return shellQuote(s)
}

// quoteTopics lists topic names quoted, so that one with spaces, commas or
// slashes still reads as one name.
func quoteTopics(topics []string) string {
	quoted := make([]string, len(topics))
	for i, t := range topics {
		quoted[i] = strconv.Quote(t)
	}
	return strings.Join(quoted, ", ")
}
