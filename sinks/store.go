package sinks

import (
	"context"
	"time"

	"github.com/projector-dev/projector/projection"
)

// Target is what one sink serves: one projection of one consumer
// identity, with the engine's options for it. A rebuild would ask for a
// second sink of the same projection under another identity (its own
// table, offsets and parked events) while the first keeps serving.
type Target struct {
	Identity   string
	Projection *projection.Projection
	// DLQTopic, when set, is the Kafka topic dead letters are also
	// published to: the sink queues each new one for it in the batch's
	// transaction.
	DLQTopic string
	// StateCacheRows and StateCacheBytes bound how much of its
	// aggregates' state the sink may keep in memory between batches (0:
	// the sink's default; negative: none).
	StateCacheRows  int
	StateCacheBytes int64
}

// Claimed is the result of claiming one partition. NextOffset is nil when
// nothing was ever stored for it.
type Claimed struct {
	TP
	Epoch      int64
	NextOffset *int64
	At         time.Time // once the store had stored the claim
}

// Offsets stores the next offset of every partition one consumer identity
// owns, and the owner epoch that fences its older owners.
type Offsets interface {
	// Claim takes ownership of partitions: it bumps each one's owner
	// epoch, which fences every earlier owner, and returns where to
	// resume.
	Claim(ctx context.Context, tps []TP) ([]Claimed, error)
	// InitAll sets the first offsets of claimed partitions that had none
	// stored, firsts[i] for claims[i]. It returns the partitions it set:
	// one left out has a newer owner.
	InitAll(ctx context.Context, claims []Claimed, firsts []int64) ([]TP, error)
	// Adopt claims a partition again after an operator reset its stored
	// offset while this member, at epoch mine, owned it. ok is false when
	// there is nothing to adopt.
	Adopt(ctx context.Context, tp TP, mine int64) (c Claimed, ok bool, err error)
	// Owners reads the owner epoch and stored next offset of partitions
	// without claiming them; a partition never claimed is left out.
	Owners(ctx context.Context, tps []TP) ([]Claimed, error)
}

// Forgetter is a Sink that keeps state of a partition's aggregates in
// memory: it drops that state once the partition has left this member,
// since its next owner may change the rows.
type Forgetter interface {
	Forget(tp TP)
}

// CacheStats describes a sink's state cache: what it holds now and, since
// the sink was made, how many of the aggregates its batches needed were
// found in it (Hits) and read from the database (Misses), per attempt of
// a batch (one planned again counts again). Aggregates first seen in
// their batch are planned as new and are neither.
type CacheStats struct {
	Entries      int
	Bytes        int64 // as counted against the state cache's byte bound
	Hits, Misses int64
}

// CacheReporter is a Sink with a state cache whose use the engine exports
// as metrics.
type CacheReporter interface {
	CacheStats() CacheStats
}

// TombstoneReporter is a Sink that says how it checked that aggregates
// assumed new had no tombstone: ruled out in memory, or probed in the
// database.
type TombstoneReporter interface {
	TombstoneChecks() (ruledOut, probed int64)
}

// PartitionState is what a member says of a partition it is assigned
// when something keeps it from moving: State is one of the
// PartitionState… values, Reason says why in a sentence, Since is when
// the state began. Halt names what halted a PartitionHalted partition
// (one of the Halt… values), so that an operator can tell the halts apart
// without reading the reason. The zero State means the partition moves.
type PartitionState struct {
	TP
	State  string
	Halt   string
	Reason string
	Since  time.Time
}

// The states a member reports of a partition (see PartitionState).
const (
	PartitionBackingOff = "backing-off" // retrying a failed transaction past the unready time
	PartitionStalled    = "stalled"     // records wait and nothing has committed for the stall time
	PartitionHalted     = "halted"      // stopped until an operator acts
	PartitionOrphaned   = "orphaned"    // assigned here, without a worker: a newer owner claimed it
	// PartitionReleased: its member stopped without leaving the group (a
	// static member, --instance-id), which holds the partition for it
	// until its session times out or it comes back.
	PartitionReleased = "released"
)

// What halted a partition (PartitionState.Halt). Each halt lasts until
// its cause is gone or an operator resets the partition's stored offset
// (projector offsets reset), from which the partition then resumes.
const (
	HaltDeadLetterStorm   = "dead-letter-storm"  // most of its recent records would be dead letters of one class
	HaltStatementsRefused = "statements-refused" // Postgres refuses the statements projector writes with
	HaltRecordsDeleted    = "records-deleted"    // retention deleted records before they were applied
	HaltBeyondLogEnd      = "beyond-log-end"     // the stored offset is past the log end (the topic was created again)
	HaltOffsetNotInLog    = "offset-not-in-log"  // the broker says the offset is out of range and the log's bounds do not say why
)
