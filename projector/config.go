package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/schemas"
	"github.com/projector-dev/projector/sinks"
)

// What to do when retention deleted records before they were applied.
const (
	OffsetLostHalt = "halt"
	OffsetLostSkip = "skip"
)

// DefaultMemberMaxRecords is the most records a member holds unless told
// otherwise (see Config.MemberMaxRecords): a share of 5000 records for
// the batch and as many for the buffer of each of up to 12 partitions, in
// which default batches of 2000 and a buffer of 4000 fit (about 50 MB of
// live heap with 200-byte events: a decoded event in a batch takes about
// 1 KB, a buffered record about 0.5 KB). A member with 48 partitions
// batches and buffers 1250 records each instead of growing to four times
// that.
const DefaultMemberMaxRecords = 120_000

// Start positions for partitions without a stored offset.
const (
	StartEarliest = "earliest"
	StartLatest   = "latest"
)

// Config configures an Engine. Validate names the field at fault.
type Config struct {
	// Brokers are the Kafka seed brokers.
	Brokers []string
	// Identity is the consumer identity: the Kafka group id and the
	// namespace of stored offsets and parked events.
	Identity string
	// Projections to run; each one's topic is consumed.
	Projections []*projection.Projection
	// Store makes each projection's sink and the identity's offset store
	// (postgres.NewStore for Postgres). Required.
	Store Store
	// StartFrom is where a partition without a stored offset starts:
	// "earliest" (default) or "latest".
	StartFrom string
	// Partition tunes the partition workers (batch size and wait, buffer,
	// retry backoff, the dead-letter storm guard); its RetryBase and RetryCap also pace the engine's
	// retries of claims and start offsets. A nil ClassifyDecode is the
	// engine's own, ClassifyDecode.
	Partition partition.Config
	// StateCacheRows is how many aggregates' rows each projection keeps in
	// memory, so that a batch reads from Postgres only the aggregates it
	// has not seen recently (0: the sink's default; negative:
	// no cache, every batch reads its aggregates). projector must be the
	// only writer of its tables: a row changed behind its back is noticed
	// (the batch is retried from Postgres) only when its version moved or
	// it was deleted.
	StateCacheRows int
	// MemberMaxRecords bounds the records this member holds across the
	// partitions it owns, fetched and waiting or in a batch being
	// applied: each partition's worker gets an equal share for its batch
	// and as much for its buffer, so that memory does not grow with the
	// number of partitions, and a transaction of several batches holds
	// the rows of at most as many aggregates as both shares together (a
	// worker holds two while one commits and the next is planned)
	// (0: DefaultMemberMaxRecords; negative: no
	// bound beyond each worker's BatchMaxRecords and MaxBuffered). The
	// engine sets Partition.Share to apply it.
	MemberMaxRecords int
	// StateCacheBytes bounds the same cache by memory, whichever bound it
	// reaches first (0: the sink's default; negative: no
	// cache). It counts each aggregate's key and encoded row and a fixed
	// amount of bookkeeping, and a fixed amount per partition.
	StateCacheBytes int64
	// RevokeTimeout bounds how long a revoked partition's worker may take
	// to finish its open batch before it is abandoned (default 10s).
	RevokeTimeout time.Duration
	// ShutdownTimeout bounds how long Run, once its context ends, waits
	// for the workers to commit the batches they have planned before it
	// abandons them and leaves the group (default
	// DefaultShutdownTimeout). Keep it below the time the process is given
	// to exit (Kubernetes' terminationGracePeriodSeconds, 30s by default).
	ShutdownTimeout time.Duration
	// GroupProtocol is the consumer group protocol (Kafka's
	// group.protocol): "classic" (default), where the members assign the
	// partitions among themselves with the cooperative-sticky balancer,
	// or "consumer" (KIP-848, Kafka 4.0 or later), where the brokers'
	// group coordinator assigns them (its uniform assignor) and hands
	// them over incrementally on the members' heartbeats. Under
	// "consumer" the session timeout and heartbeat interval are the
	// brokers' (group.consumer.session.timeout.ms, default 45s, and
	// group.consumer.heartbeat.interval.ms, or the group's
	// consumer.session.timeout.ms), so SessionTimeout does not apply.
	// Brokers that do not offer it, or have it turned off, are joined
	// with the classic protocol, which the engine warns about once.
	GroupProtocol string
	// SessionTimeout is how long the group waits for a silent member
	// before it reassigns its partitions (Kafka's session.timeout.ms;
	// 0: 45s), under the classic group protocol only. A crashed
	// member's partitions resume after it.
	SessionTimeout time.Duration
	// InstanceID makes this member static (Kafka's group.instance.id),
	// under either group protocol: a restart within the session timeout
	// gets its partitions back without a rebalance. Empty (default):
	// dynamic membership.
	InstanceID string
	// DLQTopic, when set, is the Kafka topic dead letters are also
	// published to (from an outbox written in the batch's transaction).
	DLQTopic string
	// OnOffsetLost is what happens when retention deleted records beyond a
	// partition's stored offset before they were applied: "halt" (default:
	// the partition stops fetching and says so once in the log, in
	// projector_partition_halted and in /readyz) or "skip" (continue from
	// the log start; the skipped offsets are counted). A stored offset
	// past the log end (the topic was created again) always halts.
	OnOffsetLost string
	// Repairers gives projections with on_gap repair their repair source,
	// by projection name. A projection missing here gets one built from
	// its Repair spec (HTTP or SQL).
	Repairers map[string]partition.Repairer
	// TracerProvider, when set, traces each batch (see partition.Config
	// Tracer). Nil: no tracing.
	TracerProvider trace.TracerProvider
	// ProgressEvery is how often the engine logs, per projection, one
	// line of what its partitions did (records applied, stale,
	// dead-lettered, lag) when anything moved (default
	// DefaultProgressEvery; negative: never).
	ProgressEvery time.Duration
	// ReclaimAfter is how long a partition the group assigns to this
	// member, but whose worker a newer owner fenced (another member of
	// the same identity in another group, or a stale assignment), waits
	// before the member claims it back: it does so once the partition has
	// had records to apply and its stored offset has not moved for
	// ReclaimAfter, so that a newer owner that applies records keeps the
	// partition and one that is gone does not orphan it (default
	// DefaultReclaimAfter).
	ReclaimAfter time.Duration
	// TombstoneRetention is how long a deleted aggregate's tombstone is
	// kept, for the projections that do not set their own
	// (projection.Projection.TombstoneRetention); older ones are pruned
	// in the background when the Store is a TombstonePruner. Like
	// Kafka's delete.retention.ms, it must exceed the time a late copy
	// of an aggregate's events may still arrive: one arriving after its
	// tombstone was pruned may write the row again. 0:
	// DefaultTombstoneRetention; negative: kept forever.
	TombstoneRetention time.Duration
	// KafkaCommitInterval is how often the member also commits the
	// offsets it stored in Postgres to its Kafka consumer group (the
	// identity), so that Kafka's tools (kafka-consumer-groups), Burrow
	// and autoscalers (KEDA) see the group's lag: at most one commit in
	// flight, of the latest offset of each partition that moved, plus
	// one as partitions are revoked and as the member shuts down. The
	// group's offsets are advisory: the engine never reads them (each
	// partition starts from its offset in Postgres), and a failed commit
	// is counted and logged, never fatal. 0:
	// DefaultKafkaCommitInterval; negative: the group's offsets are left
	// alone.
	KafkaCommitInterval time.Duration
	// RedriveInterval is how often the engine looks for dead letters
	// queued for redrive (projector dlq redrive) under its identity, one
	// indexed query for all its partitions, and tells the workers of the
	// partitions that have some to apply them: a worker applies at most
	// partition.Config.RedriveMax per look. 0: DefaultRedriveInterval.
	// Only with a store that keeps dead letters (DeadLetterStore).
	RedriveInterval time.Duration
	// Logger receives the engine's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the engine's metrics (default: a private
	// registry, i.e. not exported).
	Registerer prometheus.Registerer
	// ClientOpts are extra franz-go options (TLS, SASL, timeouts).
	ClientOpts []kgo.Opt
}

// DefaultShutdownTimeout is how long a member that is told to stop waits
// for its planned batches to commit unless told otherwise: well inside
// Kubernetes' default grace period of 30 seconds, leaving time to leave
// the group and exit before the pod is killed.
const DefaultShutdownTimeout = 20 * time.Second

// fetchMaxWait bounds how long the broker holds a fetch with no new data.
const fetchMaxWait = 100 * time.Millisecond

// fetchMaxPartitionBytes bounds one fetch's data for one partition (a
// record batch larger than that still comes whole).
const fetchMaxPartitionBytes = 256 << 10

func (c *Config) validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("config: Brokers: at least one seed broker is required")
	}
	if c.Identity == "" {
		return errors.New("config: Identity: the consumer identity is required")
	}
	if len(c.Projections) == 0 {
		return errors.New("config: Projections: at least one projection is required")
	}
	if c.Store == nil {
		return errors.New("config: Store: the store of sinks and offsets is required (postgres.NewStore for Postgres)")
	}
	names := map[string]bool{}
	for _, p := range c.Projections {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("config: Projections: %w", err)
		}
		if names[p.Name] {
			return fmt.Errorf("config: Projections: projection %q is given twice", p.Name)
		}
		names[p.Name] = true
	}
	if err := projection.CheckShared(c.Projections); err != nil {
		return fmt.Errorf("config: Projections: %w", err)
	}
	if err := c.Partition.Validate(); err != nil {
		return fmt.Errorf("config: Partition: %w", err)
	}
	if c.Partition.ClassifyDecode == nil {
		// Without it a registry that does not answer would dead-letter
		// every record instead of being waited for.
		c.Partition.ClassifyDecode = ClassifyDecode
	}
	switch c.StartFrom {
	case "":
		c.StartFrom = StartEarliest
	case StartEarliest, StartLatest:
	default:
		return fmt.Errorf("config: StartFrom: %q, want earliest or latest", c.StartFrom)
	}
	switch c.GroupProtocol {
	case "":
		c.GroupProtocol = GroupProtocolClassic
	case GroupProtocolClassic, GroupProtocolConsumer:
	default:
		return fmt.Errorf("config: GroupProtocol: %q, want classic or consumer", c.GroupProtocol)
	}
	switch c.OnOffsetLost {
	case "":
		c.OnOffsetLost = OffsetLostHalt
	case OffsetLostHalt, OffsetLostSkip:
	default:
		return fmt.Errorf("config: OnOffsetLost: %q, want halt or skip", c.OnOffsetLost)
	}
	if c.RevokeTimeout <= 0 {
		c.RevokeTimeout = 10 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = DefaultProgressEvery
	}
	if c.ReclaimAfter <= 0 {
		c.ReclaimAfter = DefaultReclaimAfter
	}
	if c.TombstoneRetention == 0 {
		c.TombstoneRetention = DefaultTombstoneRetention
	}
	if c.KafkaCommitInterval == 0 {
		c.KafkaCommitInterval = DefaultKafkaCommitInterval
	}
	if c.RedriveInterval <= 0 {
		c.RedriveInterval = DefaultRedriveInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// Decoders gives the decoder of each projection (by projection name).
type Decoders func(p *projection.Projection) partition.Decoder

// A *schemas.Decoder with a reader schema decodes events into values.
var _ partition.ValuesDecoder = (*schemas.Decoder)(nil)

// Store makes the sinks and offset stores an engine runs its projections
// with, as a driver does for a database client: the engine never names a
// concrete one.
type Store interface {
	// Offsets returns the offset store of a consumer identity.
	Offsets(identity string) sinks.Offsets
	// Sink returns the sink of one projection of a consumer identity.
	Sink(t sinks.Target) (sinks.Sink, error)
	// Ping reports whether the store answers (for /readyz).
	Ping(ctx context.Context) error
}

// DeadLetterStore is a Store that keeps dead letters in Postgres: the
// engine exports how many are open, and with DLQTopic set it publishes
// them from the pool's outbox.
type DeadLetterStore interface {
	DeadLetterDepth(ctx context.Context, identity string) (map[string]int64, error)
	DeadLetterPool() *pgxpool.Pool
}
