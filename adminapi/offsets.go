package adminapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/projection"
)

// ResetBody is the body of POST /admin/v1/offsets/resets: the stored
// offsets of a topic's partitions (all when none are named) move to
// exactly one target.
type ResetBody struct {
	Topic      string  `json:"topic"`
	Partitions []int32 `json:"partitions,omitempty"`
	// To is earliest (each partition's log start) or latest (its log end).
	To string `json:"to,omitempty"`
	// ToOffset is an offset, kept within each partition's log.
	ToOffset *int64 `json:"to_offset,omitempty"`
	// ToDatetime is an RFC 3339 time: the first record at or after it.
	ToDatetime string `json:"to_datetime,omitempty"`
	// DryRun answers the plan, changing nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// Reset is a checked ResetBody.
type Reset struct {
	Topic      string
	Partitions []int32 // sorted; empty: all
	Earliest   bool
	Latest     bool
	Offset     *int64
	At         time.Time // zero unless by time
	DryRun     bool
}

// Target words the reset's target for the audit rows, as the offsets
// reset command's flags do.
func (r Reset) Target() string {
	switch {
	case r.Earliest:
		return "--to-earliest"
	case r.Latest:
		return "--to-latest"
	case r.Offset != nil:
		return fmt.Sprintf("--to-offset %d", *r.Offset)
	}
	return "--to-datetime " + r.At.UTC().Format(time.RFC3339Nano)
}

// ResetLine is one partition of a reset's plan and outcome.
type ResetLine struct {
	Topic          string `json:"topic"`
	Partition      int32  `json:"partition"`
	CurrentOffset  *int64 `json:"current_offset"`
	NewOffset      int64  `json:"new_offset"`
	LogStartOffset int64  `json:"log_start_offset"`
	LogEndOffset   int64  `json:"log_end_offset"`
	// OwnerEpoch, once applied, is the epoch that fences the member that
	// ran the partition.
	OwnerEpoch *int64 `json:"owner_epoch,omitempty"`
	Note       string `json:"note,omitempty"`
}

// ResetAnswer is the answer of an offset reset.
type ResetAnswer struct {
	DryRun     bool        `json:"dry_run"`
	Partitions []ResetLine `json:"partitions"`
	// Group says what became of the Kafka consumer group's own offsets.
	Group string `json:"group,omitempty"`
}

// BadResetError is a reset that cannot be planned (no such topic or
// partition), naming the field: a 400.
type BadResetError struct{ Detail string }

func (e *BadResetError) Error() string { return e.Detail }

// OffsetResetter plans and applies offset resets of the API's identity
// as the offsets reset command does: it needs the brokers, for the
// partitions' log bounds.
type OffsetResetter interface {
	// ResetOffsets plans r and, unless r.DryRun, applies it, audited by
	// who in the transaction that moves the offsets.
	ResetOffsets(ctx context.Context, who deadletters.Actor, r Reset) (ResetAnswer, error)
}

// check turns b into a Reset, naming the field that is wrong.
func (b ResetBody) check() (Reset, error) {
	r := Reset{Topic: b.Topic, Offset: b.ToOffset, DryRun: b.DryRun}
	if b.Topic == "" {
		return r, errors.New("topic: required, the topic whose stored offsets move")
	}
	if err := projection.CheckTopic(b.Topic); err != nil {
		return r, fmt.Errorf("topic: %w", err)
	}
	for _, p := range b.Partitions {
		if p < 0 {
			return r, fmt.Errorf("partitions: %d is not a partition number", p)
		}
		if slices.Contains(r.Partitions, p) {
			return r, fmt.Errorf("partitions: %d given twice", p)
		}
		r.Partitions = append(r.Partitions, p)
	}
	slices.Sort(r.Partitions)
	n := 0
	switch b.To {
	case "":
	case "earliest":
		r.Earliest, n = true, n+1
	case "latest":
		r.Latest, n = true, n+1
	default:
		return r, fmt.Errorf("to %q: want earliest or latest (or to_offset, to_datetime)", b.To)
	}
	if b.ToOffset != nil {
		if *b.ToOffset < 0 {
			return r, fmt.Errorf("to_offset %d: want 0 or more", *b.ToOffset)
		}
		n++
	}
	if b.ToDatetime != "" {
		at, err := time.Parse(time.RFC3339Nano, b.ToDatetime)
		if err != nil {
			return r, fmt.Errorf("to_datetime %q: want an RFC 3339 time such as 2026-12-01T09:00:00Z", b.ToDatetime)
		}
		r.At, n = at, n+1
	}
	if n != 1 {
		return r, errors.New("to, to_offset, to_datetime: give exactly one")
	}
	return r, nil
}

func (s *server) resetOffsets(w http.ResponseWriter, r *http.Request) {
	var body ResetBody
	if !decode(w, r, &body) {
		return
	}
	reset, err := body.check()
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	if s.cfg.Offsets == nil {
		problem(w, http.StatusNotImplemented, CodeNotServed,
			"offset resets need the brokers, for the partitions' log bounds: use the admin API of projector run --api, or projector offsets reset")
		return
	}
	ans, err := s.cfg.Offsets.ResetOffsets(r.Context(), actorOf(r.Context()), reset)
	var bad *BadResetError
	if errors.As(err, &bad) {
		badRequest(w, bad.Detail)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}
