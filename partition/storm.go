package partition

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projector-dev/projector/internal/redact"
	"github.com/projector-dev/projector/sinks"
)

// Most of a partition's recent records failing with one class is not a
// few bad records but a mistake: a projection's key field or reader schema
// wrong, producers writing with a schema the registry does not have yet, a
// column type the rows do not fit. Dead-lettering them all would move the
// offset past the stream, and recovering would be a replay of every dead
// letter. So a batch that would make more than Config.DeadLetterStormShare
// of the partition's last Config.DeadLetterStormWindow records dead
// letters of one class is not committed: the partition halts as it does
// for refused statements (fetching paused, /readyz failing,
// projector_partition_dead_letter_storm, one error line, then at most one
// a minute) and tries the batch again, decoded afresh, every RetryCap, so
// that it resumes by itself once the cause is gone (a schema registered, a
// column type fixed). A mistake in the configuration needs a deploy that
// fixes it; turning the guard off lets a deliberate flood through; an
// operator's offset reset skips the records: the engine then replaces the
// worker with one from the reset offset, whose guard has seen none of
// them.
//
// The guard judges only once stormLeast records, or the whole window when
// it is smaller, are in view: a topic's first records, two bad ones of
// three, are dead-lettered as ever. It counts the records this worker has
// seen, so a worker that takes a partition over starts counting afresh.

// DefaultDeadLetterStormShare and DefaultDeadLetterStormWindow are the
// storm guard's settings unless told otherwise: a partition halts when
// more than half of its last 1,000 records would be dead letters of one
// class.
const (
	DefaultDeadLetterStormShare  = 0.5
	DefaultDeadLetterStormWindow = 1000
)

// stormLeast is how many records the guard needs in view before it
// judges (the window, when smaller).
const stormLeast = 100

// stormLogEvery is how often a partition halted by a storm says so again.
const stormLogEvery = time.Minute

// stormTrip is the record of a batch that makes a dead-letter storm: the
// batch is not committed.
type stormTrip struct {
	// projection is the one whose dead letters make the storm, on a topic
	// feeding several ("": the worker's own).
	projection string
	class      string
	dead       int // of the class among the last records
	records    int // in view
	share      float64
	offset     int64
	key        []byte
	err        string
}

func (s *stormTrip) Error() string {
	return fmt.Sprintf("dead-letter storm: %d of the last %d records would be dead-lettered as %s, more than the storm share %g allows; the one at offset %d (record key %q) failed with: %s",
		s.dead, s.records, s.class, s.share, s.offset, clip(string(s.key)), redact.String(s.err))
}

// stormGuard keeps the outcomes of a partition's recent records: not
// dead-lettered, or the class of their dead letter. It holds those of the
// records committed, then those of batches planned and not committed yet
// (a window's, or one in its transaction), which are dropped when they do
// not commit (truncate). Only Run's goroutine touches it.
type stormGuard struct {
	share float64 // 0: off
	size  int     // records in view at most
	least int     // records in view before it judges
	ids   map[string]uint8
	// classes are the dead-letter classes by id; id 0 is a record not
	// dead-lettered.
	classes []string
	// seq is the outcomes, oldest first: the last size committed ones at
	// least, then the uncommitted ones. base is the position of seq[0],
	// kept the position up to which they are committed.
	seq        []uint8
	base, kept int64
	counts     []int // by id, over the last size outcomes of seq
	byOffset   map[int64]int
}

func newStormGuard(c Config) stormGuard {
	g := stormGuard{classes: []string{""}, counts: []int{0}, ids: map[string]uint8{}, byOffset: map[int64]int{}}
	if c.DeadLetterStormShare > 0 {
		g.share, g.size = c.DeadLetterStormShare, c.DeadLetterStormWindow
		g.least = min(g.size, stormLeast)
	}
	return g
}

// pos is the position after the last outcome.
func (g *stormGuard) pos() int64 { return g.base + int64(len(g.seq)) }

func (g *stormGuard) id(class string) uint8 {
	if id, ok := g.ids[class]; ok {
		return id
	}
	if len(g.classes) == 255 {
		return 254 // classes are a handful; a flood of new ones shares the last
	}
	id := uint8(len(g.classes))
	g.ids[class] = id
	g.classes = append(g.classes, class)
	g.counts = append(g.counts, 0)
	return id
}

func (g *stormGuard) push(o uint8) {
	g.seq = append(g.seq, o)
	g.counts[o]++
	if n := len(g.seq); n > g.size {
		g.counts[g.seq[n-1-g.size]]--
	}
}

// add appends the outcomes of a batch's items, in offset order, which
// dead dead-letters (by offset; dead letters of other records, parked in
// earlier batches, do not count). It returns the first record that makes
// a storm (nil: none); what it appended stays until truncate.
func (g *stormGuard) add(items []*item, dead []sinks.DeadLetter) *stormTrip {
	if g.share <= 0 {
		return nil
	}
	if len(dead) == 0 {
		for range items {
			g.push(0) // records that apply never start a storm
		}
		return nil
	}
	clear(g.byOffset)
	for i := range dead {
		g.byOffset[dead[i].Offset] = i
	}
	for _, it := range items {
		i, ok := g.byOffset[it.offset]
		if !ok || it.restored {
			g.push(0)
			continue
		}
		d := &dead[i]
		o := g.id(d.Class)
		g.push(o)
		n := min(len(g.seq), g.size)
		if n >= g.least && float64(g.counts[o]) > g.share*float64(n) {
			return &stormTrip{class: d.Class, dead: g.counts[o], records: n, share: g.share, offset: d.Offset, key: d.RecordKey, err: d.Err}
		}
	}
	return nil
}

// truncate drops the outcomes from position mark on: their records did
// not commit.
func (g *stormGuard) truncate(mark int64) {
	mark = max(mark, g.kept, g.base)
	if mark >= g.pos() {
		return
	}
	g.seq = g.seq[:mark-g.base]
	clear(g.counts)
	for _, o := range g.seq[max(0, len(g.seq)-g.size):] {
		g.counts[o]++
	}
}

// commit marks the outcomes before position mark committed, and forgets
// those that have left the view.
func (g *stormGuard) commit(mark int64) {
	g.kept = max(g.kept, min(mark, g.pos()))
	if drop := g.kept - g.base - int64(g.size); drop >= int64(g.size) && drop > 0 {
		n := copy(g.seq, g.seq[drop:])
		g.seq = g.seq[:n]
		g.base += drop
	}
}

// stormHalt is a partition's halt for a dead-letter storm.
type stormHalt struct {
	on     bool
	class  string
	logged time.Time
}

func newStormGauge(reg prometheus.Registerer, labels prometheus.Labels) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name:        "projector_partition_dead_letter_storm",
		ConstLabels: labels,
		Help:        "1 while a partition is halted because more than --dead-letter-storm-share of its last --dead-letter-storm-window records would be dead letters of one class (the class label); it tries the batch again every --retry-cap and resumes once they are not, or from an offset reset (projector offsets reset).",
	}, []string{"topic", "partition", "class"})
	reg.MustRegister(g)
	return g
}

// stormed halts the partition for trip, or keeps it halted: said at once,
// then at most once per stormLogEvery (a new class at once).
func (w *Worker) stormed(trip *stormTrip) {
	p := strconv.Itoa(int(w.claim.Partition))
	now := w.now()
	s := &w.storm
	if s.on && s.class == trip.class && now.Sub(s.logged) < stormLogEvery {
		return
	}
	if s.on && s.class != trip.class {
		w.metrics.storm.DeleteLabelValues(w.claim.Topic, p, s.class)
	}
	s.on, s.class, s.logged = true, trip.class, now
	w.Halt(sinks.HaltDeadLetterStorm, fmt.Sprintf("%v; the partition tries the batch again every %s and resumes once its records are no longer dead-lettered so, or from an offset reset (projector offsets reset)", trip, w.cfg.RetryCap))
	w.metrics.storm.WithLabelValues(w.claim.Topic, p, trip.class).Set(1)
	name := w.lanes[0].proj.Name
	if trip.projection != "" {
		name = trip.projection
	}
	w.log.Error("partition halted: dead-letter storm; the batch is not committed and the stored offset stays before it",
		"projection", name, "class", trip.class, "share", float64(trip.dead)/float64(trip.records),
		"dead", trip.dead, "records", trip.records, "offset", trip.offset, "key", clip(string(trip.key)),
		"err", redact.String(trip.err), "retry_every", w.cfg.RetryCap)
}

// stormOver ends a halt for a dead-letter storm, if any: a batch
// committed.
func (w *Worker) stormOver() {
	if !w.storm.on {
		return
	}
	class := w.storm.class
	w.leaveStorm()
	w.mu.Lock()
	w.syncFetch()
	w.mu.Unlock()
	w.log.Info("partition resumed: its records are no longer dead-lettered in a storm", "projection", w.lanes[0].proj.Name, "class", class)
}

// leaveStorm ends a halt for a storm, if any, without a word: as the
// worker stops, the partition is no longer this member's to report.
func (w *Worker) leaveStorm() {
	if !w.storm.on {
		return
	}
	w.metrics.storm.DeleteLabelValues(w.claim.Topic, strconv.Itoa(int(w.claim.Partition)), w.storm.class)
	w.storm = stormHalt{}
	if !w.refusing {
		w.halted.Store(nil)
	}
}
