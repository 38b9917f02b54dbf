package readapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/readapi"
)

// benchRows is the size of the projection read, and benchConcurrency
// the requests in flight at once, on each side.
const (
	benchRows        = 100_000
	benchConcurrency = 32
)

// BenchmarkGetRow reads rows by key over loopback HTTP at a concurrency
// of 32, beside the same SELECT by key through pgx alone at the same
// concurrency on the same pool, against a projection of 100,000 rows.
// Each reports req/s and its p50 and p99 latency; the target is api at
// 60% or more of pgx's req/s.
//
//   - api: 32 keep-alive connections, each writing a request and reading
//     its answer in turn, as a load generator (wrk, hey) does;
//   - api-net-http: the same through net/http's Client, whose two
//     goroutines per connection cost the client about as much CPU as the
//     server spends;
//   - pgx: pool.QueryRow(...).Scan, what a service reading the table
//     itself runs.
//
// The client runs in the server's process: on a machine of two cores a
// process of its own would take the same CPU from the server, and the
// pgx side's client shares the process the same way.
func BenchmarkGetRow(b *testing.B) {
	bb := setup(b, ordersYAML, readapi.Config{Authenticator: auth.None{}})
	if _, err := bb.db.Pool.Exec(b.Context(), `INSERT INTO orders (id, org, status, amount, version)
		SELECT 'k' || i, 'acme', 'open', i, 1 FROM generate_series(1, $1) i`, benchRows); err != nil {
		b.Fatal(err)
	}
	if _, err := bb.db.Pool.Exec(b.Context(), `VACUUM ANALYZE orders`); err != nil {
		b.Fatal(err)
	}
	addr := strings.TrimPrefix(bb.srv.URL, "http://")
	b.Run("api", func(b *testing.B) {
		conns := make([]*rawClient, benchConcurrency)
		for i := range conns {
			c, err := dialRaw(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.close()
			conns[i] = c
		}
		runConcurrently(b, func(g int, key string) error {
			return conns[g].get("/v1/projections/orders/rows/" + key)
		})
	})
	b.Run("api-net-http", func(b *testing.B) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency}}
		defer client.CloseIdleConnections()
		runConcurrently(b, func(_ int, key string) error {
			resp, err := client.Get(bb.srv.URL + "/v1/projections/orders/rows/" + key)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		})
	})
	b.Run("pgx", func(b *testing.B) {
		runConcurrently(b, func(_ int, key string) error {
			var id, org, status string
			var amount, version int64
			return bb.db.Pool.QueryRow(b.Context(), `SELECT id, org, status, amount, version FROM orders WHERE id = $1`, key).
				Scan(&id, &org, &status, &amount, &version)
		})
	})
}

// runConcurrently runs b.N calls of do over benchConcurrency goroutines,
// each call with a key of the projection, and reports req/s, p50 and p99.
func runConcurrently(b *testing.B, do func(g int, key string) error) {
	var next atomic.Int64
	lat := make([][]time.Duration, benchConcurrency)
	var wg sync.WaitGroup
	errs := make(chan error, benchConcurrency)
	b.ResetTimer()
	began := time.Now()
	for g := range benchConcurrency {
		wg.Go(func() {
			l := make([]time.Duration, 0, b.N/benchConcurrency+1)
			defer func() { lat[g] = l }()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				// Keys in a stride over the table, not in insertion order.
				key := fmt.Sprintf("k%d", (i*7919)%benchRows+1)
				t := time.Now()
				if err := do(g, key); err != nil {
					errs <- err
					return
				}
				l = append(l, time.Since(t))
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/took.Seconds(), "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}

// rawClient is one keep-alive connection that sends a GET and reads its
// answer in turn.
type rawClient struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

func dialRaw(addr string) (*rawClient, error) {
	c, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &rawClient{conn: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}, nil
}

func (c *rawClient) close() { c.conn.Close() }

func (c *rawClient) get(path string) error { return c.ask(path, "", "200") }

// ask sends a GET of path, with header lines (each ending in CRLF) when
// not "", and reads its answer, whose status must be one of statuses.
func (c *rawClient) ask(path, header string, statuses ...string) error {
	_, _ = c.w.WriteString("GET ")
	_, _ = c.w.WriteString(path)
	_, _ = c.w.WriteString(" HTTP/1.1\r\nHost: bench\r\n")
	_, _ = c.w.WriteString(header)
	_, _ = c.w.WriteString("\r\n")
	if err := c.w.Flush(); err != nil {
		return err
	}
	// The answer's status line and headers, read without building an
	// http.Response: the load generator's own cost stays small beside
	// the server's.
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	status, ok := bytes.CutPrefix(line, []byte("HTTP/1.1 "))
	if !ok || len(status) < 4 || status[3] != ' ' || !slices.ContainsFunc(statuses, func(s string) bool { return string(status[:3]) == s }) {
		return fmt.Errorf("answer %q, want status %s", line, strings.Join(statuses, " or "))
	}
	length := -1
	for {
		line, err = c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(name, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil {
				return fmt.Errorf("content-length %q: %w", value, err)
			}
		}
	}
	if length < 0 {
		return errors.New("an answer without Content-Length")
	}
	_, err = c.r.Discard(length)
	return err
}
