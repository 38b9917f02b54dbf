package projector

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/sinks"
)

// A member records in the store what keeps each of its partitions from
// moving (backing off, stalled, halted, orphaned) with a reason, so that
// projector status, which reads the database and the brokers and not the
// members, shows it on every replica's partitions. The states are
// computed from the workers' status as the stall watch looks at them and
// written only when one changes; a partition first seen moving clears
// what an earlier owner left. A member leaving clears what it recorded:
// its next owner records its own. Batches never write them.

// StateRecorder is a Store that keeps the members' partition states (see
// sinks.PartitionState). A store without it records none.
type StateRecorder interface {
	RecordStates(ctx context.Context, identity, member string, states []sinks.PartitionState) error
}

// stateRecord is what the stall watch last recorded of the partitions.
type stateRecord struct {
	rec    StateRecorder
	member string
	last   map[sinks.TP]sinks.PartitionState
	failed bool // the last write failed (said once)
}

func newStateRecord(store Store, instanceID string) *stateRecord {
	rec, _ := store.(StateRecorder)
	if rec == nil {
		return nil
	}
	member := instanceID
	if member == "" {
		host, _ := os.Hostname()
		member = host + "/" + strconv.Itoa(os.Getpid())
	}
	return &stateRecord{rec: rec, member: member, last: map[sinks.TP]sinks.PartitionState{}}
}

// partitionStates says what keeps each partition this member is assigned
// from moving; a zero State: nothing.
func (e *Engine) partitionStates() map[sinks.TP]sinks.PartitionState {
	out := map[sinks.TP]sinks.PartitionState{}
	for _, s := range e.Workers() {
		st := sinks.PartitionState{TP: s.TP}
		switch {
		case s.Halted != "":
			st.State, st.Halt, st.Reason, st.Since = sinks.PartitionHalted, s.HaltKind, s.Halted, s.HaltedSince
		case s.Stalled:
			st.State, st.Since = sinks.PartitionStalled, s.ProgressAt
			st.Reason = "records wait and nothing has committed since " + s.ProgressAt.UTC().Format(time.RFC3339)
			if s.BackoffErr != "" {
				st.Reason += "; retrying " + s.BackoffErr
			}
		case s.Unready:
			st.State, st.Since = sinks.PartitionBackingOff, s.BackoffSince
			st.Reason = "retrying since " + s.BackoffSince.UTC().Format(time.RFC3339) + ": " + s.BackoffErr
		}
		st.Reason = redact.ClipTo(st.Reason, 4*redact.MaxQuoted)
		out[s.TP] = st
	}
	for _, o := range e.orphanStatus() {
		st := sinks.PartitionState{TP: o.TP, State: sinks.PartitionOrphaned, Reason: o.Reason, Since: o.Since}
		if o.Stalled {
			st.State, st.Reason = sinks.PartitionStalled, "orphaned ("+o.Reason+") and its records wait uncommitted"
		}
		out[o.TP] = st
	}
	return out
}

// recordStates writes the partition states that changed since the last
// look: a partition first seen moving is cleared too, of what an earlier
// owner left, and one no longer assigned here is cleared.
func (e *Engine) recordStates(ctx context.Context) {
	r := e.stateRec
	if r == nil {
		return
	}
	cur := e.partitionStates()
	var changed []sinks.PartitionState
	for tp, st := range cur {
		prev, seen := r.last[tp]
		switch {
		case !seen:
		case prev.State == st.State && prev.Halt == st.Halt && prev.Reason == st.Reason:
			continue
		case prev.State == st.State && prev.Halt == st.Halt:
			st.Since = prev.Since // the same state, said anew
		}
		changed = append(changed, st)
	}
	for tp, prev := range r.last {
		if _, ok := cur[tp]; !ok && prev.State != "" {
			changed = append(changed, sinks.PartitionState{TP: tp})
		}
	}
	e.writeStates(ctx, cur, changed)
}

// clearStates clears every state this member recorded, as it leaves.
func (e *Engine) clearStates() {
	r := e.stateRec
	if r == nil {
		return
	}
	var changed []sinks.PartitionState
	for tp, prev := range r.last {
		if prev.State != "" {
			changed = append(changed, sinks.PartitionState{TP: tp})
		}
	}
	e.writeStates(context.Background(), nil, changed)
}

// releaseStates records, as a static member leaves, the partitions it ran
// as released: the group holds them for it until its session times out,
// and the state tells the others (and projector status) that nobody runs
// them meanwhile. Every other state it recorded is cleared; its next
// owner, or itself back, clears the released ones as it sees them move.
func (e *Engine) releaseStates(tps []sinks.TP) {
	r := e.stateRec
	if r == nil {
		return
	}
	now := e.now()
	cur := map[sinks.TP]sinks.PartitionState{}
	var changed []sinks.PartitionState
	for _, tp := range tps {
		st := sinks.PartitionState{TP: tp, State: sinks.PartitionReleased, Since: now,
			Reason: "its member " + r.member + " stopped without leaving the group (static membership): nobody runs it until the member is back or its session times out"}
		cur[tp] = st
		changed = append(changed, st)
	}
	for tp, prev := range r.last {
		if _, ok := cur[tp]; !ok && prev.State != "" {
			changed = append(changed, sinks.PartitionState{TP: tp})
		}
	}
	e.writeStates(context.Background(), cur, changed)
}

// StateReader is a Store that reads back the partition states the
// members recorded; a store without it lets no member tell a partition
// released by a stopped static member.
type StateReader interface {
	PartitionStates(ctx context.Context, identity string) (map[sinks.TP]sinks.PartitionState, error)
}

// writeStates writes the changed states, cur being every state now; a
// failure is said once, and what failed is written at the next look.
func (e *Engine) writeStates(ctx context.Context, cur map[sinks.TP]sinks.PartitionState, changed []sinks.PartitionState) {
	r := e.stateRec
	if len(changed) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.rec.RecordStates(wctx, e.cfg.Identity, r.member, changed); err != nil {
		if !r.failed {
			r.failed = true
			e.log.Warn("recording partition states for projector status failed; trying again", "err", err)
		}
		return
	}
	if r.failed {
		r.failed = false
		e.log.Info("recording partition states for projector status works again")
	}
	for _, st := range changed {
		if _, ok := cur[st.TP]; ok {
			r.last[st.TP] = st
		} else {
			delete(r.last, st.TP)
		}
	}
}
