package postgres

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// BenchmarkStateCache is the cache's share of a batch: looking up 1,000
// keys among 100,000 cached aggregates, then storing the batch's writes.
func BenchmarkStateCache(b *testing.B) {
	cols := []projection.Column{{Name: "account_id", Type: "text"}, {Name: "owner", Type: "text"},
		{Name: "balance", Type: "bigint"}, {Name: "opened_at", Type: "timestamptz"}}
	const aggregates, batch = 100_000, 1000
	keys := make([]string, aggregates)
	for i := range keys {
		keys[i] = fmt.Sprintf("acc-%07d", i)
	}
	row := func(k string, n int64) projection.Row {
		return projection.Row{"account_id": k, "owner": "owner " + k[4:], "balance": n, "opened_at": "2026-01-01 00:00:00+00"}
	}
	rows := make(map[string]projection.Row, aggregates)
	for _, k := range keys {
		rows[k] = row(k, 7)
	}
	c := newStateCache(aggregates+1, 1<<40, cols, true)
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	loaded := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
	for _, k := range keys {
		loaded.Rows[k], loaded.Versions[k] = row(k, 1), 1
	}
	c.store(claim, keys, loaded, nil, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	batches := make([][]string, 64)
	for i := range batches {
		batches[i] = make([]string, batch)
		for j := range batches[i] {
			batches[i][j] = keys[rng.IntN(aggregates)]
		}
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		ks := batches[n%len(batches)]
		st := sinks.State{Rows: make(map[string]projection.Row, batch), Versions: make(map[string]int64, batch)}
		misses, _, _ := c.lookup(claim, ks, st, true)
		writes := make([]sinks.RowWrite, 0, len(ks))
		for _, k := range ks {
			writes = append(writes, sinks.RowWrite{Key: k, Version: st.Versions[k] + 1, Row: rows[k]})
		}
		c.store(claim, misses, st, writes, nil)
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*batch), "ns/key")
}

// BenchmarkStateCacheFill is the cache's share of batches whose
// aggregates are all new, as while a stream of many aggregates first
// reaches them: 1,000 keys missed and inserted per batch, until the cache
// holds a million (then it starts over).
func BenchmarkStateCacheFill(b *testing.B) {
	cols := []projection.Column{{Name: "account_id", Type: "text"}, {Name: "owner", Type: "text"},
		{Name: "balance", Type: "bigint"}, {Name: "opened_at", Type: "timestamptz"}}
	const aggregates, batch = 1_000_000, 1000
	keys := make([]string, aggregates)
	writes := make([]sinks.RowWrite, aggregates)
	for i := range keys {
		keys[i] = fmt.Sprintf("acc-%07d", i)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for i, k := range keys {
		writes[i] = sinks.RowWrite{Key: k, Version: 1,
			Row: projection.Row{"account_id": k, "owner": "owner " + k[4:], "balance": int64(7), "opened_at": "2026-01-01 00:00:00+00"}}
	}
	claim := sinks.Claim{TP: sinks.TP{Topic: "t"}, Epoch: 1}
	b.ReportAllocs()
	var c *stateCache
	n := 0
	for b.Loop() {
		i := n % (aggregates / batch)
		if i == 0 {
			c = newStateCache(aggregates+1, 1<<40, cols, true)
		}
		ks := keys[i*batch:][:batch]
		st := sinks.State{Rows: map[string]projection.Row{}, Versions: map[string]int64{}}
		misses, _, _ := c.lookup(claim, ks, st, true)
		c.store(claim, misses, st, writes[i*batch:][:batch], nil)
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*batch), "ns/key")
}
