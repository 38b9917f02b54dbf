package partition

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/projector-dev/projector/sinks"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/testenv"
)

// slowFetcher is a fetcher whose pause takes effect only when the test
// releases it, like a client busy with a fetch response.
type slowFetcher struct {
	entered, release chan struct{}

	mu     sync.Mutex
	paused bool
}

func (f *slowFetcher) PauseFetchPartitions(map[string][]int32) map[string][]int32 {
	f.entered <- struct{}{}
	<-f.release
	f.mu.Lock()
	f.paused = true
	f.mu.Unlock()
	return nil
}

func (f *slowFetcher) ResumeFetchPartitions(map[string][]int32) {
	f.mu.Lock()
	f.paused = false
	f.mu.Unlock()
}

func (f *slowFetcher) isPaused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paused
}

// A worker whose buffer fills (fetching paused) and is emptied by its next
// batch at the same moment must leave fetching resumed: a pause that
// overtook the resume once left a partition paused for good, its worker
// idle with an empty buffer while its lag stood still.
func TestFetchingResumesWhenABatchEmptiesTheBufferDuringAPause(t *testing.T) {
	f := &slowFetcher{entered: make(chan struct{}), release: make(chan struct{})}
	cfg := Config{BatchMaxRecords: 4, MaxBuffered: 4, BatchMaxWait: time.Millisecond}
	w := NewWorker(cfg, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: "t", Partition: 0}}, Fetcher: f,
		Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), nil)})

	recs := make([]*kgo.Record, 4)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "t", Offset: int64(i), Timestamp: time.Now()}
	}
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		w.Push(recs, 4) // fills the buffer: pauses, slowly
	}()
	<-f.entered

	// The batch takes the whole buffer while the pause is under way. Give
	// it the chance to finish first (it cannot when pausing and resuming
	// are ordered), then let the pause complete.
	got := make(chan job, 1)
	go func() {
		j, _ := w.nextBatch(t.Context(), nil)
		got <- j
	}()
	var j job
	select {
	case j = <-got:
	case <-time.After(200 * time.Millisecond):
	}
	close(f.release)
	<-pushed
	if j.recs == nil {
		j = <-got
	}
	if len(j.recs) != 4 {
		t.Fatalf("batch of %d records, want the 4 buffered", len(j.recs))
	}
	if f.isPaused() {
		t.Fatal("fetching is paused with an empty buffer: the partition would never be fetched again")
	}

	// The next fill pauses fetching again (the release stays open).
	go w.Push(recs, 8)
	<-f.entered
	testenv.WaitFor(t, 5*time.Second, testenv.Holds("a full buffer to pause fetching", f.isPaused))
}

// A new worker resumes fetching of its partition, whatever an earlier
// worker of it left: the fetch state outlives the worker that set it.
func TestNewWorkerResumesFetching(t *testing.T) {
	f := &slowFetcher{paused: true}
	NewWorker(Config{}, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: "t", Partition: 0}}, Fetcher: f,
		Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), nil)})
	if f.isPaused() {
		t.Fatal("the partition's fetching stays paused under its new worker: it would never be fetched")
	}
}

// countingFetcher counts pauses and resumes.
type countingFetcher struct{ paused, resumed int }

func (f *countingFetcher) PauseFetchPartitions(map[string][]int32) map[string][]int32 {
	f.paused++
	return nil
}
func (f *countingFetcher) ResumeFetchPartitions(map[string][]int32) { f.resumed++ }

// A worker's share of a member-wide bound lowers its batch size and its
// buffer, as the share changes.
func TestShareBoundsBatchAndBuffer(t *testing.T) {
	share := 3
	f := &countingFetcher{}
	cfg := Config{BatchMaxRecords: 100, MaxBuffered: 100, BatchMaxWait: time.Millisecond, Share: func() int { return share }}
	w := NewWorker(cfg, WorkerDeps{Group: "g", Claim: sinks.Claim{TP: sinks.TP{Topic: "t", Partition: 0}}, Fetcher: f,
		Log: slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), nil)})
	recs := func(n int) []*kgo.Record {
		out := make([]*kgo.Record, n)
		for i := range out {
			out[i] = &kgo.Record{Topic: "t", Offset: int64(i), Timestamp: time.Now()}
		}
		return out
	}
	w.Push(recs(2), -1)
	if f.paused != 0 {
		t.Fatalf("paused with 2 records buffered, share 3")
	}
	w.Push(recs(2), -1)
	if f.paused != 1 {
		t.Fatalf("%d pauses with 4 records buffered, share 3: want 1", f.paused)
	}
	resumed := f.resumed // the new worker's own resume
	j, _ := w.nextBatch(t.Context(), nil)
	if len(j.recs) != 3 {
		t.Fatalf("batch of %d records, want the share's 3", len(j.recs))
	}
	if f.resumed != resumed {
		t.Fatal("fetching resumed with 1 record buffered: not below half of the share's 3")
	}
	if j, _ = w.nextBatch(t.Context(), nil); len(j.recs) != 1 || f.resumed != resumed+1 {
		t.Fatalf("batch of %d records, %d resumes: want the last record and fetching resumed", len(j.recs), f.resumed-resumed)
	}
	share = 50 // fewer partitions now: the whole bound applies
	w.Push(recs(60), -1)
	j, _ = w.nextBatch(t.Context(), nil)
	if len(j.recs) != 50 {
		t.Fatalf("batch of %d records with a share of 50, want 50", len(j.recs))
	}
}
