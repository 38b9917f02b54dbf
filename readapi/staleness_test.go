package readapi_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projector-dev/projector/readapi"
)

// failingStaleness fails while failing is set.
type failingStaleness struct{ failing atomic.Bool }

func (f *failingStaleness) Staleness(context.Context, string, string) (time.Duration, error) {
	if f.failing.Load() {
		return 0, errors.New(`no offsets of topic orders are stored under identity "projector", only under "orders-projector"`)
	}
	return 0, nil
}

// TestStalenessFailureIsHeardOnce: a row is still answered when its
// staleness cannot be told, without the header; why is logged once, not
// once a request, and so is its return.
func TestStalenessFailureIsHeardOnce(t *testing.T) {
	var logs lockedBuffer
	f := &failingStaleness{}
	f.failing.Store(true)
	b := setup(t, ordersYAML, readapi.Config{Staleness: f, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	b.exec(t, `INSERT INTO orders (id, org, status, amount, version) VALUES ('o1', 'acme', 'open', 12, 3)`)
	for range 3 {
		r := b.get(t, "acme", "/v1/projections/orders/rows/o1")
		if r.status != http.StatusOK || r.header.Get("Projector-Staleness-Seconds") != "" {
			t.Fatalf("status %d, staleness %q: want 200 without the header", r.status, r.header.Get("Projector-Staleness-Seconds"))
		}
	}
	out := logs.String()
	if n := strings.Count(out, "telling the staleness of projection orders failed"); n != 1 || !strings.Contains(out, `only under \"orders-projector\"`) {
		t.Fatalf("the failure logged %d times, want once with its reason:\n%s", n, out)
	}
	f.failing.Store(false)
	for range 2 {
		if r := b.get(t, "acme", "/v1/projections/orders/rows/o1"); r.header.Get("Projector-Staleness-Seconds") != "0.000" {
			t.Fatalf("staleness %q once it can be told, want 0.000", r.header.Get("Projector-Staleness-Seconds"))
		}
	}
	if n := strings.Count(logs.String(), "telling the staleness of projection orders succeeds again"); n != 1 {
		t.Fatalf("the recovery logged %d times, want once:\n%s", n, logs.String())
	}
}
