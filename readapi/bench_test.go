package readapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
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
// the requests in flight at once, on each side. benchSlice is how long
// one side runs before the other takes its turn.
const (
	benchRows        = 100_000
	benchConcurrency = 32
	benchSlice       = 250 * time.Millisecond
)

// BenchmarkGetRow reads rows by key over loopback HTTP at a concurrency
// of 32, beside the same SELECT by key through pgx alone at the same
// concurrency on the same pool, against a projection of 100,000 rows.
// The target is the API at 60% or more of pgx's req/s.
//
//   - api: 32 keep-alive connections, each writing a request and reading
//     its answer in turn, as a load generator (wrk, hey) does;
//   - api-net-http: the same through net/http's Client, whose two
//     goroutines per connection cost the client about as much CPU as the
//     server spends.
//
// Each is measured beside pgx, pool.QueryRow(...).Scan, what a service
// reading the table itself runs. The two sides take turns within the
// same run: an op is a round of a 250 ms slice of each, the side that
// goes first alternating, so that both meet the same load of a shared
// machine rather than one side its quiet seconds and the other its busy
// ones. Each side's req/s, p50 and p99 are over its own slices; api/pgx-%
// is the ratio of their req/s, and min-round-% the lowest ratio of one
// round. Run it for a number of rounds: -benchtime 20x.
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
	// The API behind the server serve runs, with its timeouts.
	srv := httptest.NewUnstartedServer(bb.api)
	srv.Config = readapi.NewServer(bb.api)
	srv.Start()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	pgxSide := benchSide{name: "pgx", do: func(_ int, key string) error {
		var id, org, status string
		var amount, version int64
		return bb.db.Pool.QueryRow(b.Context(), `SELECT id, org, status, amount, version FROM orders WHERE id = $1`, key).
			Scan(&id, &org, &status, &amount, &version)
	}}
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
		beside(b, benchSide{name: "api", do: func(g int, key string) error {
			return conns[g].get("/v1/projections/orders/rows/" + key)
		}}, pgxSide)
	})
	b.Run("api-net-http", func(b *testing.B) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency}}
		defer client.CloseIdleConnections()
		beside(b, benchSide{name: "api", do: func(_ int, key string) error {
			resp, err := client.Get(srv.URL + "/v1/projections/orders/rows/" + key)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}}, pgxSide)
	})
}

// benchSide is one side of a comparison: do reads key from goroutine g
// of benchConcurrency.
type benchSide struct {
	name string
	do   func(g int, key string) error
}

// sideRun is what a side did over its slices.
type sideRun struct {
	requests int
	took     time.Duration
	lat      []time.Duration
}

func (r *sideRun) rate() float64 { return float64(r.requests) / r.took.Seconds() }

// beside runs b.N rounds of a slice of each side, a and z, and reports
// each side's req/s, p50 and p99, and a's req/s as a percentage of z's,
// over the whole run and in its lowest round.
func beside(b *testing.B, a, z benchSide) {
	var next atomic.Int64 // the requests' count, for their keys
	runs := map[string]*sideRun{a.name: {}, z.name: {}}
	minRound := math.Inf(1)
	b.ResetTimer()
	for round := range b.N {
		order := []benchSide{a, z}
		if round%2 == 1 {
			order = []benchSide{z, a}
		}
		rates := map[string]float64{}
		for _, s := range order {
			n, took, err := runSlice(s, &next, &runs[s.name].lat)
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			runs[s.name].requests += n
			runs[s.name].took += took
			rates[s.name] = float64(n) / took.Seconds()
		}
		minRound = min(minRound, rates[a.name]/rates[z.name])
	}
	b.StopTimer()
	// The time of a round says nothing the rates do not.
	b.ReportMetric(0, "ns/op")
	for _, name := range []string{a.name, z.name} {
		r := runs[name]
		slices.Sort(r.lat)
		b.ReportMetric(r.rate(), name+"-req/s")
		b.ReportMetric(float64(r.lat[len(r.lat)/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(r.lat[len(r.lat)*99/100].Microseconds()), name+"-p99-µs")
	}
	b.ReportMetric(100*runs[a.name].rate()/runs[z.name].rate(), a.name+"/"+z.name+"-%")
	b.ReportMetric(100*minRound, "min-round-%")
}

// runSlice runs s from benchConcurrency goroutines for benchSlice, each
// request with the next key of a stride over the table, and appends the
// requests' latencies to lat. It returns how many were answered and the
// time until the last of them was: those under way when the slice ends
// finish in it.
func runSlice(s benchSide, next *atomic.Int64, lat *[]time.Duration) (int, time.Duration, error) {
	lats := make([][]time.Duration, benchConcurrency)
	errs := make([]error, benchConcurrency)
	var wg sync.WaitGroup
	began := time.Now()
	end := began.Add(benchSlice)
	for g := range benchConcurrency {
		wg.Go(func() {
			l := make([]time.Duration, 0, 1024)
			for {
				t := time.Now()
				if t.After(end) {
					break
				}
				// Keys in a stride over the table, not in insertion order.
				key := "k" + strconv.FormatInt((next.Add(1)*7919)%benchRows+1, 10)
				if err := s.do(g, key); err != nil {
					errs[g] = err
					break
				}
				l = append(l, time.Since(t))
			}
			lats[g] = l
		})
	}
	wg.Wait()
	took := time.Since(began)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	n := 0
	for _, l := range lats {
		n += len(l)
		*lat = append(*lat, l...)
	}
	return n, took, nil
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
