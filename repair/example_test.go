package repair_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/projector-dev/projector/repair"
)

// When versions of an aggregate are missing from the stream (on_gap:
// repair), the engine asks a repair source for its state at or beyond the
// first missing version. Here the source service answers with a snapshot
// for acc-1, has nothing for acc-2, and is briefly down for acc-3.
func ExampleHTTP() {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /accounts/{key}", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("key") {
		case "acc-1":
			fmt.Fprint(w, `{"version": 7, "state": {"account_id": "acc-1", "owner": "Ada", "balance": 30}}`)
		case "acc-2":
			http.NotFound(w, r)
		default:
			http.Error(w, "restarting", http.StatusServiceUnavailable)
		}
	})
	source := httptest.NewServer(mux)
	defer source.Close()

	var r repair.Repairer
	r, err := repair.NewHTTP(repair.HTTPConfig{URL: source.URL + "/accounts/{key}?from={version}"}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	res, err := r.Repair(ctx, "acc-1", 5)
	fmt.Printf("acc-1: version %d, owner %v, balance %v, err %v\n", res.Version, res.Snapshot["owner"], res.Snapshot["balance"], err)

	// Nothing to repair from: the parked events are dead-lettered.
	_, err = r.Repair(ctx, "acc-2", 3)
	fmt.Println("acc-2: not found:", errors.Is(err, repair.ErrNotFound))

	// The source is down: the engine retries with backoff and the events
	// stay parked.
	_, err = r.Repair(ctx, "acc-3", 2)
	fmt.Println("acc-3: transient:", repair.IsTransient(err))
	// Output:
	// acc-1: version 7, owner Ada, balance 30, err <nil>
	// acc-2: not found: true
	// acc-3: transient: true
}
