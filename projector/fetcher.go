package projector

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/sinks"
)

type rewind struct {
	f      *fetcher
	offset int64
	done   func()
}

// fetcher is what a worker moves its partition's fetching with: pausing
// and resuming through the client, rewinding through the poll loop.
type fetcher struct {
	e  *Engine
	tp sinks.TP
	w  *partition.Worker // set once the worker is built
}

// rewound serves the rewinds asked for, between polls (no rebalance can
// run until AllowRebalance): the client fetches those partitions again
// from the offsets asked and drops what it had buffered of them. A worker
// no longer running its partition (revoked, perhaps assigned again to a
// new one) moves nothing.
func (e *Engine) rewound() {
	e.mu.Lock()
	var move []rewind
	for _, r := range e.rewinds {
		if cur := e.workers[r.f.tp]; cur != nil && cur.w == r.f.w {
			move = append(move, r)
		} else {
			r.done()
		}
	}
	clear(e.rewinds)
	e.rewinds = e.rewinds[:0]
	e.mu.Unlock()
	for _, r := range move {
		e.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{r.f.tp.Topic: {r.f.tp.Partition: {Epoch: -1, Offset: r.offset}}})
		r.done()
	}
}

func (f *fetcher) PauseFetchPartitions(tps map[string][]int32) map[string][]int32 {
	return f.e.cl.PauseFetchPartitions(tps)
}

func (f *fetcher) ResumeFetchPartitions(tps map[string][]int32) { f.e.cl.ResumeFetchPartitions(tps) }

// Rewind implements partition.Rewinder.
func (f *fetcher) Rewind(_ sinks.TP, offset int64, done func()) {
	f.e.mu.Lock()
	f.e.rewinds = append(f.e.rewinds, rewind{f: f, offset: offset, done: done})
	f.e.mu.Unlock()
	if stop := f.e.stopPoll.Load(); stop != nil {
		(*stop)()
	}
}
