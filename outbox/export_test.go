package outbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ShardIndexName exposes the claim index's name to the tests.
var ShardIndexName = shardIndexName

// ExplainClaim runs the claim of a relay owning owned of shards shards
// (with the shard index when indexed) under EXPLAIN ANALYZE, with the
// session settings the relay's claims run with, and returns how many
// rows it returned and how many rows of the outbox its scans read.
func ExplainClaim(ctx context.Context, pool *pgxpool.Pool, shards int, owned []int64, limit int, indexed bool) (returned, read int, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off"); err != nil {
			return err
		}
		var plan []struct{ Plan node }
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+claimSQL(shards, len(owned), indexed), claimArgs(shards, owned, limit, indexed)...).Scan(&plan); err != nil {
			return err
		}
		if len(plan) != 1 {
			return fmt.Errorf("%d plans", len(plan))
		}
		returned = int(plan[0].Plan.Rows)
		read = plan[0].Plan.read()
		return nil
	})
	return returned, read, err
}

type node struct {
	Type    string  `json:"Node Type"`
	Alias   string  `json:"Alias"`
	Rows    float64 `json:"Actual Rows"`
	Loops   float64 `json:"Actual Loops"`
	Removed float64 `json:"Rows Removed by Filter"`
	Plans   []node  `json:"Plans"`
}

// read sums the rows the claimed table's scans (alias o, o_1 …, not the
// blocked rows' probes b) produced or filtered out.
func (n node) read() int {
	total := 0
	if strings.HasSuffix(n.Type, "Scan") && (n.Alias == "o" || strings.HasPrefix(n.Alias, "o_")) {
		total += int((n.Rows + n.Removed) * n.Loops)
	}
	for _, c := range n.Plans {
		total += c.read()
	}
	return total
}
