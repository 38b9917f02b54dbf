package sinks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/projector-dev/projector/projection"
)

// TP names one topic-partition.
type TP struct {
	Topic     string
	Partition int32
}

// Claim is this worker's ownership of a partition: the owner epoch it won
// and the stored offset to resume from.
type Claim struct {
	TP
	Epoch      int64
	NextOffset int64
	// Since is when the claim was stored (zero: not known). What a sink
	// reads of the partition's aggregates after it stays true while the
	// claim lasts, but for the owner's own writes.
	Since time.Time
	// CaughtUp: the commit reaches the partition's high watermark as the
	// worker last saw it. The sink records when, in the statement that
	// stores the offset, for readers to tell how stale the partition is.
	CaughtUp bool
}

// Header is one Kafka record header.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// StoredEvent is a raw record kept by the sink: a parked event waiting for
// a missing version.
type StoredEvent struct {
	Key       string // aggregate id
	Version   int64
	Offset    int64
	RecordKey []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// State is what the sink has stored for the aggregates of a batch.
type State struct {
	// Rows holds the current row of each aggregate that has one. They are
	// the plan's: it folds events into them (projection.FoldOwned), so a
	// sink hands every plan rows of its own. A projection whose fold does
	// not read rows (projection.FoldReadsRow) may be given empty rows that
	// only say the row exists.
	Rows map[string]projection.Row
	// Versions holds each known aggregate's last applied version, including
	// aggregates whose row was deleted.
	Versions map[string]int64
	// Parked holds the events parked earlier for the requested keys.
	Parked []StoredEvent
}

// RowWrite is a row to insert or replace.
type RowWrite struct {
	Key     string
	Version int64
	Row     projection.Row
}

// RowDelete deletes an aggregate's row; its version is kept aside so a late
// duplicate can never bring the row back.
type RowDelete struct {
	Key     string
	Version int64
}

// ParkedRef names a parked event that no longer waits.
type ParkedRef struct {
	Key     string
	Version int64
}

// Error classes of dead letters.
const (
	ClassDecode    = "decode"    // bad bytes, unknown schema id, unresolvable schema
	ClassInvalid   = "invalid"   // decoded, but no usable key or version
	ClassFold      = "fold"      // the fold refused the event
	ClassOversized = "oversized" // over the record size limit
	ClassRejected  = "rejected"  // Postgres refused the row the event produced
	ClassGap       = "gap"       // parked behind a version that never came and could not be repaired
	// ClassKeyMismatch: the record key is not the aggregate the event's
	// key field names. A partition owns the aggregates of its record keys
	// (their rows, cached state, tombstones and parked events): applied to
	// another aggregate, such an event could race that aggregate's own
	// partition for its row.
	ClassKeyMismatch = "key_mismatch"
	// ClassInvalidKey: the record key is not one projector's tables can
	// hold as text (invalid UTF-8, a NUL byte), or is longer than the key
	// limit (a key is an index entry of several tables, and an index
	// entry holds at most about 2,700 bytes).
	ClassInvalidKey = "invalid_key"
	// ClassRefused: Postgres refused the writes of this record alone, with
	// a data error (SQLSTATE classes 22, 23, 54) in a statement other than
	// its row's: found by applying the batch it came in again in halves.
	ClassRefused = "refused"
	// ClassInvalidValue: the row the aggregate's events make holds a value
	// its column cannot (a NUL byte or invalid UTF-8 for text and jsonb):
	// Postgres refused it (SQLSTATE 22021, 22P05), the message names the
	// column.
	ClassInvalidValue = "invalid_value"
)

// Classes lists every error class of dead letters.
var Classes = []string{ClassDecode, ClassInvalid, ClassInvalidKey, ClassKeyMismatch, ClassFold, ClassOversized, ClassInvalidValue, ClassRejected, ClassRefused, ClassGap}

// ReplayHeader names the dead letter a replayed record came from.
const ReplayHeader = "projector-dlq-id"

// DeadLetter is a record that cannot be applied.
type DeadLetter struct {
	Offset    int64
	RecordKey []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
	Err       string
	Class     string
	Attempts  int
	SchemaID  int    // 0 when unknown
	TraceID   string // from the record's traceparent, "" when absent
	// ReplayOf is the dead letter this record is a replay of (0: none):
	// the sink updates that entry instead of adding one.
	ReplayOf int64
}

// Changes is everything one batch writes besides the stored offset.
type Changes struct {
	Upserts     []RowWrite
	Deletes     []RowDelete
	Park        []StoredEvent
	Unpark      []ParkedRef
	DeadLetters []DeadLetter
	// Resolved lists dead letters whose replayed record has now applied
	// (or was already applied).
	Resolved []int64
	// Redriven lists the redrive queue's entries (Redrive.QueueID) whose
	// dead letters the batch applied again: the sink takes them off the
	// queue and audits them, RedrivenBy naming the worker for the audit
	// log, after the batch's dead letters are written.
	Redriven   []int64
	RedrivenBy string
}

// Redrive is a dead letter queued for the worker that owns its partition
// to apply again, with its record.
type Redrive struct {
	QueueID    int64
	DeadLetter int64
	Projection string
	Offset     int64
	RecordKey  []byte
	Value      []byte
	Headers    []Header
	Timestamp  time.Time
}

// RejectedRows reports rows Postgres refused (a data error such as a value
// out of range or an index entry too large), by aggregate key. The batch
// was rolled back; the worker dead-letters those aggregates' events and
// commits the rest.
type RejectedRows struct {
	Keys map[string]string // aggregate key → Postgres error
	// Invalid marks the aggregates of Keys whose row holds a value its
	// column cannot (see ClassInvalidValue).
	Invalid map[string]bool
	// Lane is the index, in the lanes given to CommitLanes, of the
	// projection whose rows they are (0 for CommitBatch).
	Lane int
}

func (r *RejectedRows) Error() string {
	return fmt.Sprintf("postgres refused the rows of %d aggregates", len(r.Keys))
}

// ErrFenced reports that a newer owner has claimed the partition: the
// batch was rolled back and this worker must stop.
var ErrFenced = errors.New("partition claimed by a newer owner")

// ErrRefusedData marks a failure that says Postgres refused what the
// batch writes or reads (a data exception, an integrity constraint, a
// program limit: SQLSTATE classes 22, 23 and 54) in a way the sink could
// not pin to rows (see RejectedRows): the same transaction fails the same
// way however often it is tried. A worker applies the batch again in
// halves, each in its own transaction, until the records responsible are
// alone, and dead-letters them.
var ErrRefusedData = errors.New("postgres refuses the data of the batch")

// ErrBadStatement marks a failure that says the sink's own statements do
// not fit the database (a table or column missing or of another type, a
// privilege missing, a feature not supported): retrying cannot help until
// an operator changes the database or the configuration. A worker halts
// its partition after MaxAttempts of them in a row instead of retrying
// as if Postgres were down.
var ErrBadStatement = errors.New("postgres refuses the statements projector writes with")

// Keys names the aggregates of a batch.
type Keys struct {
	// All lists every aggregate the batch has events of.
	All []string
	// Parked lists those with events parked in earlier batches.
	Parked []string
	// New lists aggregates whose events in the batch start at version 1,
	// with none parked and no record tombstone among them. Their state is
	// all but always empty, so a sink may plan the batch assuming it is,
	// without reading it, provided its writes verify the assumption (no
	// row and no tombstone of the aggregate exists) and it plans again
	// from the state it reads when they do not. They are listed in the
	// order of All.
	New []string
	// Planned says that the plan reads only aggregates' versions and
	// whether their rows exist (it was made before the transaction): a
	// sink may give existing rows as empty ones.
	Planned bool
}

// Sink stores one projection's rows together with the partition's offset.
type Sink interface {
	// CommitBatch runs one transaction: it loads the state of keys.All
	// (and the parked events of keys.Parked), calls plan, writes the
	// changes, and moves the stored offset from claim.NextOffset to end,
	// fenced by claim.Epoch. It returns ErrFenced when a newer owner
	// exists. plan may be called more than once.
	CommitBatch(ctx context.Context, claim Claim, end int64, keys Keys, plan func(State) (Changes, error)) error
	// Parked lists the aggregates of the partition with parked events.
	Parked(ctx context.Context, tp TP) (map[string]ParkedInfo, error)
	// Load reads the state of keys and their parked events outside a
	// batch (safe: only the partition's owner writes them).
	Load(ctx context.Context, tp TP, keys []string) (State, error)
}

// Lane is one projection's part of a partition's transaction when one
// topic feeds several projections: its sink, the aggregates its events
// name, and its plan (see Sink.CommitBatch).
type Lane struct {
	Sink Sink
	Keys Keys
	Plan func(State) (Changes, error)
}

// LaneCommitter is a Sink that commits the batches of several sinks of
// one consumer identity, one per projection of a topic, in one
// transaction with the partition's stored offset: the offset stays the
// single fence of every projection's table, so that a crash leaves all of
// them at one offset.
type LaneCommitter interface {
	// CommitLanes is CommitBatch for every lane at once (their sinks of
	// the same kind and store as the receiver): each lane's state is
	// loaded and its plan called, every lane's changes are written, and
	// the offset moves from claim.NextOffset to end, or nothing is. A
	// *RejectedRows it returns names its lane.
	CommitLanes(ctx context.Context, claim Claim, end int64, lanes []Lane) error
}

// Peeker is a Sink that reads state outside a transaction, which lets a
// worker that is behind commit several batches in one (see window.go).
type Peeker interface {
	// Peek returns the state of keys as CommitBatch would load it
	// (keys.New it does not know of may be left out, assumed new): as
	// only the partition's owner writes its aggregates, it holds until
	// the owner commits them.
	Peek(ctx context.Context, claim Claim, keys Keys) (State, error)
}

// ParkedInfo describes one aggregate's parked events.
type ParkedInfo struct {
	Count int
	Since time.Time // when the oldest was parked
}

// CaughtUpMarker is a sink that records when an idle partition was last
// seen caught up, so that readers tell it from one whose member stopped.
type CaughtUpMarker interface {
	// MarkCaughtUp records that claim's partition is caught up at
	// claim.NextOffset; nothing when claim is no longer the newest.
	MarkCaughtUp(ctx context.Context, claim Claim) error
}
