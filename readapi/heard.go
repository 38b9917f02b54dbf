package readapi

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
)

// heard logs each kind of failure once when it begins and once when it
// ends, rather than once per failing request: a database that is down
// fails every request, and the requests metric counts them.
type heard struct {
	log *slog.Logger
	// failing is whether failed has any entry: a request that succeeds
	// while nothing fails takes no lock.
	failing atomic.Bool
	mu      sync.Mutex
	failed  map[string]bool
}

// failure logs what failed, with err, unless it is failing already.
func (h *heard) failure(ctx context.Context, what string, err error, attrs ...any) {
	h.mu.Lock()
	already := h.failed[what]
	h.failed[what] = true
	h.failing.Store(true)
	h.mu.Unlock()
	if !already {
		h.log.ErrorContext(ctx, what+" failed; logged again once it succeeds and fails anew", append(attrs, "err", err)...)
	}
}

// success ends what's failure, logging that it recovered.
func (h *heard) success(ctx context.Context, what string) {
	if !h.failing.Load() {
		return
	}
	h.mu.Lock()
	was := h.failed[what]
	delete(h.failed, what)
	h.failing.Store(len(h.failed) > 0)
	h.mu.Unlock()
	if was {
		h.log.InfoContext(ctx, what+" succeeds again")
	}
}
