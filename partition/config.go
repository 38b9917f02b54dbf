package partition

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/sinks"
)

// DefaultBatchMaxRecords is the most records one batch holds unless told
// otherwise. A worker that is behind commits many batches in one
// transaction (DefaultCommitMaxBatches), so how many of an aggregate's
// events collapse into one row write depends on the transaction rather
// than the batch; smaller batches hold less memory, and larger ones did
// not go faster (see docs/performance.md).
const DefaultBatchMaxRecords = 2000

// DefaultCommitMaxBatches is how many full batches' worth of records one
// transaction covers at most while a worker is behind, unless told
// otherwise: an aggregate's events in any of them collapse into one row
// write (see window.go). A transaction also waits for its batches at most
// as long as this many batches could each have waited (BatchMaxWait): 2
// seconds in all by default. On a busy machine fetching a batch takes
// longer than BatchMaxWait, and with fewer batches' worth transactions
// ended on that time, long before their records' bound, writing more rows
// per event.
const DefaultCommitMaxBatches = 40

// DefaultStallAfter is how long a worker with records to apply may go
// without a commit before it counts as stalled unless told otherwise (see
// Config.StallAfter): far longer than any transaction or backoff of a
// healthy member takes.
const DefaultStallAfter = 5 * time.Minute

// DefaultMaxKeyBytes is the longest record key a worker applies unless
// told otherwise (see Config.MaxKeyBytes): well below the 2,704 bytes a
// B-tree entry of Postgres holds, which the key shares with the other
// columns of the parked events' primary key (identity, topic, projection).
const DefaultMaxKeyBytes = 1024

// DefaultRedriveMax is how many queued redrives a worker applies in one
// transaction unless told otherwise (see Config.RedriveMax).
const DefaultRedriveMax = 100

// maxIndexedKey is the most MaxKeyBytes may be: what a B-tree entry holds
// (2,704 bytes) less room for the other columns of its index.
const maxIndexedKey = 2400

// minBuffered is the least MaxBuffered defaults to: several fetches of
// small records (a fetch brings up to 256 KiB of a partition), so that a
// worker with small batches does not pause on every fetch. Buffering more
// than a batch did not make the engine faster (it keeps one batch ready
// while the previous one commits) and only cost memory.
const minBuffered = 4000

// Config tunes a worker. Zero fields take the defaults named.
type Config struct {
	// BatchMaxRecords caps the records of one batch (default
	// DefaultBatchMaxRecords).
	BatchMaxRecords int
	// BatchMaxWait is how long a batch waits for more records after its
	// first one (default 50ms).
	BatchMaxWait time.Duration
	// MaxBuffered is how many records may wait in the worker before it
	// pauses fetching of its partition (default BatchMaxRecords, at least
	// minBuffered). It resumes below half of it.
	MaxBuffered int
	// Share, when set, lowers BatchMaxRecords and MaxBuffered each to
	// what it returns, read at every fetch and batch: an engine divides
	// a member-wide bound among the partitions it owns, so that memory
	// does not grow with their number. A transaction of several batches
	// holds the rows of up to twice as many aggregates (see windowFull).
	Share func() int

	// Throttle, when set, paces the records the worker applies: before
	// each batch it waits for as many tokens as the batch has records.
	// A rebuild's generation runs throttled so that live traffic wins.
	Throttle Throttle
	// CommitMaxBatches is how many full batches' worth of records one
	// transaction may cover while full batches wait (default
	// DefaultCommitMaxBatches; 1: each batch commits alone).
	CommitMaxBatches int
	// RetryBase and RetryCap bound the exponential backoff with full jitter
	// between attempts of a batch that failed for a transient reason
	// (defaults 100ms and 30s).
	RetryBase, RetryCap time.Duration
	// ClassifyDecode says how to treat a decode error: Terminal errors
	// dead-letter the record at once, Retryable ones after MaxAttempts,
	// Transient ones (the registry is down) retry without limit. Nil:
	// every decode error is terminal.
	ClassifyDecode func(error) Class
	// MaxAttempts is how often an error that may succeed on retry (an
	// unknown schema id, a fold error not marked terminal) is tried before
	// the record is dead-lettered (default 5).
	MaxAttempts int
	// RedriveMax is the most dead letters queued for redrive a worker
	// applies in one transaction (default DefaultRedriveMax); it takes
	// one such transaction each time its engine finds some queued (see
	// Worker.Redrive), which bounds the rate of redrives per partition.
	RedriveMax int
	// MaxRecordBytes dead-letters records whose value is larger (default
	// 1 MiB, Kafka's default message size).
	MaxRecordBytes int
	// MaxKeyBytes dead-letters records whose key is longer (class
	// invalid_key; default DefaultMaxKeyBytes, negative: no limit). An
	// aggregate's key is an entry of several B-tree indexes (the
	// projection's primary key, parked events, tombstones), which hold at
	// most about 2,700 bytes with the other columns of the entry.
	MaxKeyBytes int
	// UnreadyAfter is how long a partition may back off before it counts
	// as not ready (default 30s).
	UnreadyAfter time.Duration
	// DeadLetterStormShare and DeadLetterStormWindow guard against a
	// dead-letter storm: a batch that would make more than
	// DeadLetterStormShare of the partition's last DeadLetterStormWindow
	// records dead letters of one class is not committed, and the
	// partition halts until its records stop failing so (see storm.go).
	// The guard judges once 100 records, or the whole window when it is
	// smaller, are in view. Defaults DefaultDeadLetterStormShare and
	// DefaultDeadLetterStormWindow; a negative share turns the guard off,
	// and every failing record is dead-lettered however many fail.
	DeadLetterStormShare  float64
	DeadLetterStormWindow int
	// StallAfter is how long a worker that has records to apply may go
	// without committing before it counts as stalled (default
	// DefaultStallAfter): whatever holds it up, retried failures or a
	// call that never returns, the member is better restarted.
	StallAfter time.Duration
	// Committed, when set, is called on the worker's goroutine after each
	// transaction of the partition has committed, never for one rolled
	// back: tp, the partition's stored next offset after it (every record
	// before end has taken effect), and the aggregates whose rows it
	// wrote or deleted (nil: none; the slice is the hook's to keep). It is
	// where a reader that must see its own writes waits, until end passes
	// the offset of the event it wrote. It must return quickly: the
	// partition's next transaction waits for it.
	Committed func(tp sinks.TP, end int64, keys []string)
	// Tracer, when set, traces each batch: a "process <topic>" consumer
	// span linked to every record's producer span, with the Postgres
	// commit as a child span. Nil: no tracing.
	Tracer trace.Tracer
}

func (c *Config) defaults() {
	if c.BatchMaxRecords <= 0 {
		c.BatchMaxRecords = DefaultBatchMaxRecords
	}
	if c.CommitMaxBatches <= 0 {
		c.CommitMaxBatches = DefaultCommitMaxBatches
	}
	if c.BatchMaxWait <= 0 {
		c.BatchMaxWait = 50 * time.Millisecond
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = max(c.BatchMaxRecords, minBuffered)
	}
	if c.RetryBase <= 0 {
		c.RetryBase = 100 * time.Millisecond
	}
	if c.RetryCap <= 0 {
		c.RetryCap = 30 * time.Second
	}
	if c.ClassifyDecode == nil {
		c.ClassifyDecode = func(error) Class { return Terminal }
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.RedriveMax <= 0 {
		c.RedriveMax = DefaultRedriveMax
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = 1 << 20
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if c.UnreadyAfter <= 0 {
		c.UnreadyAfter = 30 * time.Second
	}
	if c.StallAfter <= 0 {
		c.StallAfter = DefaultStallAfter
	}
	if c.DeadLetterStormShare == 0 {
		c.DeadLetterStormShare = DefaultDeadLetterStormShare
	}
	if c.DeadLetterStormWindow <= 0 {
		c.DeadLetterStormWindow = DefaultDeadLetterStormWindow
	}
}

// Validate reports the first setting that has no meaning, by its field.
// Zero fields are valid: they take their defaults.
func (c Config) Validate() error {
	if c.DeadLetterStormShare > 1 || c.DeadLetterStormShare != c.DeadLetterStormShare {
		return fmt.Errorf("DeadLetterStormShare %v: want a share in (0, 1], 0 for the default or negative for off", c.DeadLetterStormShare)
	}
	if c.MaxKeyBytes > maxIndexedKey {
		return fmt.Errorf("MaxKeyBytes %d: want at most %d (a key is a B-tree index entry, which holds at most 2704 bytes), 0 for the default or negative for no limit", c.MaxKeyBytes, maxIndexedKey)
	}
	if c.DeadLetterStormWindow < 0 {
		return fmt.Errorf("DeadLetterStormWindow %d: want at least 1 record, or 0 for the default", c.DeadLetterStormWindow)
	}
	return nil
}

// Throttle paces a worker: golang.org/x/time/rate's Limiter is one.
type Throttle interface {
	// WaitN blocks until n records may be applied, or ctx ends; n is
	// at most Burst.
	WaitN(ctx context.Context, n int) error
	Burst() int
	// Tokens is how many records may be applied now without waiting.
	Tokens() float64
}
