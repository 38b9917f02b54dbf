package auth

import (
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// checkEvery is how often at most a watched file is looked at: a stat
// per second costs nothing next to the requests, and a file replaced by
// a deployment (a Kubernetes Secret swaps a symbolic link) is taken up
// within a second without a file-notification dependency, which misses
// such swaps on some platforms anyway.
const checkEvery = time.Second

// watchedFile tells when a file has changed since it was last loaded:
// another file at the path, another size or another modification time.
type watchedFile struct {
	path string
	now  func() time.Time

	// checked is when the file was last looked at, in Unix nanoseconds:
	// read without the lock, so that the requests of the second between
	// two checks do not queue on it.
	checked atomic.Int64

	mu   sync.Mutex
	seen os.FileInfo // the file as last loaded or refused
}

// changed reports, at most once per checkEvery, whether the file differs
// from the one last recorded by saw. A file that cannot be stat'ed counts
// as changed, so that its reader reports why.
func (w *watchedFile) changed() bool {
	now := w.now().UnixNano()
	if now-w.checked.Load() < int64(checkEvery) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if now-w.checked.Load() < int64(checkEvery) {
		return false // another request has just looked
	}
	w.checked.Store(now)
	fi, err := os.Stat(w.path)
	if err != nil {
		return w.seen != nil
	}
	return w.seen == nil || !os.SameFile(fi, w.seen) || fi.Size() != w.seen.Size() || !fi.ModTime().Equal(w.seen.ModTime())
}

// read reads the file and records it as seen, loaded or not, so that a
// file that fails to parse is reported once, not at every check.
func (w *watchedFile) read() ([]byte, error) {
	fi, statErr := os.Stat(w.path)
	data, err := os.ReadFile(w.path)
	w.mu.Lock()
	if statErr == nil {
		w.seen = fi
	} else {
		w.seen = nil
	}
	w.checked.Store(w.now().UnixNano())
	w.mu.Unlock()
	return data, err
}
