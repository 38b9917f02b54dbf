package readapi_test

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/readapi"
)

// BenchmarkGetRow reads rows by key over loopback HTTP, beside the same
// SELECT by key through pgx alone on the same pool, with 32 goroutines
// per GOMAXPROCS each (run it with -cpu 1 for a concurrency of 32).
func BenchmarkGetRow(b *testing.B) {
	bb := setup(b, ordersYAML, readapi.Config{Authenticator: auth.None{}})
	const rows = 10000
	if _, err := bb.db.Pool.Exec(b.Context(), `INSERT INTO orders (id, org, status, amount, version)
		SELECT 'k' || i, 'acme', 'open', i, 1 FROM generate_series(1, $1) i`, rows); err != nil {
		b.Fatal(err)
	}
	b.Run("api", func(b *testing.B) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		var n atomic.Int64
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)%rows + 1
				resp, err := client.Get(fmt.Sprintf("%s/v1/projections/orders/rows/k%d", bb.srv.URL, i))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	})
	b.Run("pgx", func(b *testing.B) {
		var n atomic.Int64
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)%rows + 1
				var id, org, status string
				var amount, version int64
				if err := bb.db.Pool.QueryRow(b.Context(), `SELECT id, org, status, amount, version FROM orders WHERE id = $1`, fmt.Sprintf("k%d", i)).
					Scan(&id, &org, &status, &amount, &version); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
