package partition

import (
	"context"
	"errors"
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
	// Rows holds the current row of each aggregate that has one.
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

// DeadLetter is a record that cannot be applied.
type DeadLetter struct {
	Offset    int64
	RecordKey []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
	Err       string
}

// Changes is everything one batch writes besides the stored offset.
type Changes struct {
	Upserts     []RowWrite
	Deletes     []RowDelete
	Park        []StoredEvent
	Unpark      []ParkedRef
	DeadLetters []DeadLetter
}

// ErrFenced reports that a newer owner has claimed the partition: the
// batch was rolled back and this worker must stop.
var ErrFenced = errors.New("partition claimed by a newer owner")

// Sink stores one projection's rows together with the partition's offset.
type Sink interface {
	// CommitBatch runs one transaction: it loads the state of keys (and the
	// parked events of parkedKeys), calls plan, writes the changes, and
	// moves the stored offset from claim.NextOffset to end, fenced by
	// claim.Epoch. It returns ErrFenced when a newer owner exists.
	CommitBatch(ctx context.Context, claim Claim, end int64, keys, parkedKeys []string, plan func(State) (Changes, error)) error
	// ParkedKeys lists the aggregates of the partition with parked events.
	ParkedKeys(ctx context.Context, tp TP) ([]string, error)
}
