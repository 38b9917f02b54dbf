package readapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/projector-dev/projector/freshness"
)

// WatcherWaiter answers the API's waits with w's: a process's one
// watcher of versions, shared by every request that waits.
func WatcherWaiter(w *freshness.Watcher) Waiter { return watcherWaiter{w} }

type watcherWaiter struct{ w *freshness.Watcher }

func (v watcherWaiter) WaitVersion(ctx context.Context, projection, key, tenant string, min int64, wait time.Duration) error {
	r, err := v.w.WaitVersion(ctx, projection, key, tenant, min, wait)
	switch {
	case errors.Is(err, freshness.ErrTooManyWaiters):
		return fmt.Errorf("%w: %w", ErrTooManyWaiters, err)
	case err != nil:
		return err
	case !r.Reached:
		return fmt.Errorf("%w: at version %d", ErrVersionNotReached, r.Version)
	case r.Deleted && !r.Found:
		return &DeletedError{Version: r.Version}
	}
	return nil
}
