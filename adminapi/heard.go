package adminapi

import (
	"context"
	"log/slog"
	"sync"
)

// heard logs each kind of failure once when it begins and once when it
// ends, rather than once per failing request: a database that is down
// fails every request, and the requests metric counts them.
type heard struct {
	log    *slog.Logger
	mu     sync.Mutex
	failed map[string]bool
}

// failure logs what failed, with err, unless it is failing already.
func (h *heard) failure(ctx context.Context, what string, err error, attrs ...any) {
	h.mu.Lock()
	already := h.failed[what]
	h.failed[what] = true
	h.mu.Unlock()
	if !already {
		h.log.ErrorContext(ctx, "admin API: "+what+" failed; logged again once it succeeds and fails anew", append(attrs, "err", err)...)
	}
}

// success ends what's failure, logging that it recovered.
func (h *heard) success(ctx context.Context, what string) {
	h.mu.Lock()
	was := h.failed[what]
	delete(h.failed, what)
	h.mu.Unlock()
	if was {
		h.log.InfoContext(ctx, "admin API: "+what+" succeeds again")
	}
}
