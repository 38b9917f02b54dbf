package projector

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

// ResetCheckInterval is how often a halted partition is looked at again:
// its log's bounds listed again when they could not be listed, and its
// stored offset checked for an operator's reset (projector offsets reset),
// from which it then resumes, whatever halted it (see watchHalts).
const ResetCheckInterval = 10 * time.Second

const lostRecheck = ResetCheckInterval

// lostPartition is a partition whose stored offset the broker reported
// out of range, for its current worker.
type lostPartition struct {
	w       *partition.Worker
	kind    string      // why it halted: haltRecordsDeleted, haltBeyondLogEnd or haltUnknown; "" not yet known
	logged  time.Time   // when its error was last logged
	recheck *time.Timer // set while it is halted (see armRecheck)
	due     bool        // the recheck timer has fired
}

// offsetLost handles a partition whose stored offset the broker reported
// out of range. It compares the offset with the log's bounds: below the
// log start, retention deleted records before they were applied (halt, or
// skip to the log start with OnOffsetLost skip); past the log end, the
// log is not the one the offset came from (always halt: skipping cannot
// help). A halted partition's fetching is paused, so that the client does
// not ask again and again, and its error is logged once, then at most
// once per haltLogEvery. It runs in the poll loop, where moving the fetch
// position is safe.
func (e *Engine) offsetLost(ctx context.Context, tp sinks.TP) {
	e.mu.Lock()
	r := e.workers[tp]
	lp := e.outOfLog[tp]
	if r != nil && (lp == nil || lp.w != r.w) {
		if lp != nil && lp.recheck != nil {
			lp.recheck.Stop() // of the partition's previous worker
		}
		lp = &lostPartition{w: r.w}
		e.outOfLog[tp] = lp
	}
	waiting := lp != nil && lp.recheck != nil && !lp.due
	e.mu.Unlock()
	if r == nil {
		return
	}
	if lp.kind == haltRecordsDeleted || lp.kind == haltBeyondLogEnd || waiting {
		// Seen again (a fetch answered before the pause took effect):
		// nothing changed, so no new listing.
		e.logLost(lp, lp.kind, r.w.Status())
		return
	}
	st := r.w.Status()
	logStart, logEnd, err := e.logBounds(ctx, tp)
	e.mu.Lock()
	lp.due = false
	if lp.recheck != nil {
		lp.recheck.Stop()
		lp.recheck = nil
	}
	e.mu.Unlock()
	var kind, reason string
	switch {
	case err != nil:
		kind = haltUnknown
		reason = fmt.Sprintf("the stored offset %d is not in the log, and the log's bounds could not be listed (%v); checking again in %s",
			st.NextOffset, err, lostRecheck)
	case st.NextOffset < logStart:
		if e.cfg.OnOffsetLost == OffsetLostSkip {
			e.skipLost(ctx, r, lp, st.NextOffset, logStart)
			return
		}
		kind = haltRecordsDeleted
		reason = fmt.Sprintf("records from offset %d to %d were deleted by retention (the log now starts at %d) before they were applied; "+
			"the partition is halted: restore them, or run with --on-offset-lost=skip to continue from the log start and lose them "+
			"(or move the stored offset with: projector offsets reset --topic %s --partitions %d --to-earliest --execute)",
			st.NextOffset, logStart-1, logStart, tp.Topic, tp.Partition)
	case st.NextOffset > logEnd:
		kind = haltBeyondLogEnd
		reason = fmt.Sprintf("the stored offset %d is beyond the log end %d (the log starts at %d): the topic was deleted and created again, "+
			"or the partition lost records it had acknowledged; the partition is halted and --on-offset-lost=skip does not apply: "+
			"check that this log is the one the projection was built from, then move the stored offset with: "+
			"projector offsets reset --topic %s --partitions %d --to-earliest --execute (or --to-latest)",
			st.NextOffset, logEnd, logStart, tp.Topic, tp.Partition)
	case st.Halted != "":
		// Halted for a reason that went away (the bounds could be listed
		// again, or records were produced since): fetching goes on. lp
		// stays, so that the error is still logged at most once per
		// haltLogEvery should the broker say out of range again.
		r.w.Unhalt()
		e.setHalted(tp, "")
		return
	default:
		// The stored offset is in the log, the fetch position was not (the
		// worker had fetched past a log end that then moved back): wait,
		// paused, and look again, rather than ask at every fetch.
		kind = haltUnknown
		reason = fmt.Sprintf("the broker reports the fetch position out of range although the stored offset %d is in the log [%d, %d]; checking again in %s",
			st.NextOffset, logStart, logEnd, lostRecheck)
	}
	r.w.Halt(haltKinds[kind], reason)
	e.setHalted(tp, kind)
	e.mu.Lock()
	if lp.kind != kind {
		lp.logged = time.Time{} // news: said at once
	}
	lp.kind = kind
	e.armRecheck(lp)
	e.mu.Unlock()
	e.logLost(lp, kind, r.w.Status())
}

// armRecheck has the poll loop look at a halted partition again after
// lostRecheck: list the log's bounds again when they could not be listed,
// and otherwise look for an operator's reset of the stored offset. Call
// with mu held.
func (e *Engine) armRecheck(lp *lostPartition) {
	lp.due = false
	lp.recheck = time.AfterFunc(lostRecheck, func() {
		e.mu.Lock()
		lp.due = true
		e.mu.Unlock()
		if stop := e.stopPoll.Load(); stop != nil {
			(*stop)()
		}
	})
}

// logBounds lists the log start and end offsets of a partition.
func (e *Engine) logBounds(ctx context.Context, tp sinks.TP) (start, end int64, err error) {
	lookup := func(list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
		res, err := list(ctx, tp.Topic)
		if err != nil {
			return 0, err
		}
		o, ok := res.Lookup(tp.Topic, tp.Partition)
		if !ok {
			return 0, fmt.Errorf("no offset listed for %s/%d", tp.Topic, tp.Partition)
		}
		return o.Offset, o.Err
	}
	if start, err = lookup(e.adm.ListStartOffsets); err != nil {
		return 0, 0, fmt.Errorf("list log start of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	if end, err = lookup(e.adm.ListEndOffsets); err != nil {
		return 0, 0, fmt.Errorf("list log end of %s/%d: %w", tp.Topic, tp.Partition, err)
	}
	return start, end, nil
}

// skipLost moves a partition whose records retention deleted to the log
// start (OnOffsetLost skip).
func (e *Engine) skipLost(ctx context.Context, r *running, lp *lostPartition, from, logStart int64) {
	tp := r.w.TP()
	if err := r.w.SkipTo(ctx, logStart); err != nil {
		e.log.Error("skipping deleted records failed", "topic", tp.Topic, "partition", tp.Partition, "from", from, "to", logStart, "err", err)
		return
	}
	e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: logStart}}})
	e.mu.Lock()
	if e.outOfLog[tp] == lp {
		delete(e.outOfLog, tp)
	}
	e.mu.Unlock()
	e.setHalted(tp, "")
}

// logLost logs a halted partition's error unless it was logged less than
// haltLogEvery ago.
func (e *Engine) logLost(lp *lostPartition, kind string, st partition.Status) {
	now := e.now()
	e.mu.Lock()
	quiet := !lp.logged.IsZero() && now.Sub(lp.logged) < haltLogEvery
	if !quiet {
		lp.logged = now
	}
	e.mu.Unlock()
	if quiet || st.Halted == "" {
		return
	}
	msg := "partition halted: records were deleted before they were applied"
	switch kind {
	case haltBeyondLogEnd:
		msg = "partition halted: stored offset is beyond the log end"
	case haltUnknown:
		msg = "partition halted: stored offset is not in the log"
	}
	e.log.Error(msg, "topic", st.Topic, "partition", st.Partition, "stored_offset", st.NextOffset, "reason", st.Halted)
}

// setHalted sets projector_partition_halted of a partition to 1 for the
// reason kind and removes it for the others ("": halted for none).
func (e *Engine) setHalted(tp sinks.TP, kind string) {
	p := strconv.Itoa(int(tp.Partition))
	for _, k := range []string{haltRecordsDeleted, haltBeyondLogEnd, haltUnknown} {
		if k == kind {
			e.group.halted.WithLabelValues(tp.Topic, p, k).Set(1)
		} else {
			e.group.halted.DeleteLabelValues(tp.Topic, p, k)
		}
	}
}

// recheckLost looks again at the halted partitions whose recheck is due
// (see armRecheck and watchHalts), and at the partitions whose worker was
// fenced.
func (e *Engine) recheckLost(ctx context.Context) {
	type check struct {
		tp              sinks.TP
		epoch           int64
		unknown, halted bool
	}
	var checks []check
	e.mu.Lock()
	for tp, lp := range e.outOfLog {
		r := e.workers[tp]
		if !lp.due || r == nil || r.w != lp.w {
			continue
		}
		checks = append(checks, check{tp: tp, epoch: r.epoch, unknown: lp.kind == haltUnknown, halted: true})
		if lp.kind != haltUnknown {
			e.armRecheck(lp)
		}
	}
	for tp, epoch := range e.adopt {
		checks = append(checks, check{tp: tp, epoch: epoch})
	}
	clear(e.adopt)
	for _, h := range e.haltedDue() {
		checks = append(checks, check{tp: h.tp, epoch: h.epoch, halted: true})
	}
	e.mu.Unlock()
	for _, c := range checks {
		adopted := e.adoptReset(ctx, c.tp, c.epoch, !c.halted)
		switch {
		case !adopted && c.unknown:
			e.offsetLost(ctx, c.tp)
		case !adopted && !c.halted:
			// Fenced by a newer owner, not by an operator's reset, while
			// the group still assigns the partition here.
			e.orphaned(c.tp, c.epoch, "its worker was fenced: a newer owner claimed it")
		}
	}
}

// adoptReset takes a partition up again from its new stored offset when
// an operator reset it (projector offsets reset) while this member owned
// it at epoch mine: the reset fenced the member's worker, or the worker
// is halted and would never commit. A partition a newer member claimed
// is left alone. It runs in the poll loop, between rebalances, so the
// partition is still assigned here. A failed look is logged when it was
// the only one (fenced); a halted partition looks again anyway.
func (e *Engine) adoptReset(ctx context.Context, tp sinks.TP, mine int64, fenced bool) (adopted bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, ok, err := e.gen.offsets.Adopt(ctx, tp, mine)
	if err != nil {
		level := slog.LevelDebug
		if fenced {
			level = slog.LevelWarn
		}
		e.log.Log(ctx, level, "looking for an offset reset of a fenced or halted partition failed", "topic", tp.Topic, "partition", tp.Partition, "err", err)
		return false
	}
	if !ok {
		return false
	}
	e.forgetLost(map[string][]int32{tp.Topic: {tp.Partition}})
	halt := e.retire(tp)
	e.start(sinks.Claim{TP: tp, Epoch: c.Epoch, NextOffset: *c.NextOffset, Since: c.At})
	e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: *c.NextOffset}}})
	if halt != "" {
		e.log.Warn("halted partition resumes from an operator's offset reset", "topic", tp.Topic, "partition", tp.Partition, "next_offset", *c.NextOffset, "halt", halt)
	} else {
		e.log.Warn("partition resumes from an operator's offset reset", "topic", tp.Topic, "partition", tp.Partition, "next_offset", *c.NextOffset)
	}
	return true
}

// forgetLost drops what offsetLost knew of partitions this member no
// longer runs (nil: all); their new owner finds out for itself.
func (e *Engine) forgetLost(tps map[string][]int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for tp, lp := range e.outOfLog {
		if tps != nil && !slices.Contains(tps[tp.Topic], tp.Partition) {
			continue
		}
		if lp.recheck != nil {
			lp.recheck.Stop()
		}
		delete(e.outOfLog, tp)
		e.setHalted(tp, "")
	}
}

// Why a partition's stored offset is not in its log, as the reason label
// of projector_partition_halted says.
const (
	// haltRecordsDeleted: retention deleted records from the stored offset
	// on before they were applied (the offset is below the log start).
	haltRecordsDeleted = "records_deleted"
	// haltBeyondLogEnd: the offset is past the log end, so the log is not
	// the one the offset was stored from (the topic was deleted and
	// created again) or it lost acknowledged records.
	haltBeyondLogEnd = "beyond_log_end"
	// haltUnknown: the log's bounds could not be listed; they are listed
	// again after lostRecheck.
	haltUnknown = "unknown"
)

// haltKinds gives the halt each reason label of projector_partition_halted
// is (see sinks.PartitionState.Halt).
var haltKinds = map[string]string{
	haltRecordsDeleted: sinks.HaltRecordsDeleted,
	haltBeyondLogEnd:   sinks.HaltBeyondLogEnd,
	haltUnknown:        sinks.HaltOffsetNotInLog,
}

// haltLogEvery is how often a halted partition's error is logged again
// when the condition is seen again: once is enough to act on, and a
// broker answering every fetch at once must not flood the log.
const haltLogEvery = time.Minute
