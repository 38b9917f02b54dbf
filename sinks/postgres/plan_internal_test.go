package postgres

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// The row statements keep the plans they were written for, as Postgres
// reuses them for every batch (a generic plan): the arrays stream through
// a SELECT list instead of being materialised by a function scan, and
// rows are found by probing the key's index rather than by hashing the
// table (see planIndexProbes).
func TestRowStatementPlans(t *testing.T) {
	ctx := t.Context()
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatal(err)
	}
	db := testenv.NewDB(t)
	if err := Migrate(ctx, db.Pool, ps[0]); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Pool.Begin(ctx) // set up as a batch transaction is
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Rollback(ctx) //nolint:errcheck // nothing to keep
	if _, err := conn.Exec(ctx, planIndexProbes); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	st := rowSQL(ps[0])
	params := regexp.MustCompile(`\$(\d+)`)
	for _, tc := range []struct {
		name, sql string
		want      []string
	}{
		{"update", st.update, []string{"Index Scan using accounts_pkey"}},
		{"insert", st.insert, nil},
		{"insert new", st.insertNew, []string{"Index Only Scan using projector_tombstones_pkey"}},
		{"upsert", st.upsert, nil},
		{"load", st.load, []string{"Index Scan using accounts_pkey"}},
		{"load tombstones", tombstoneLoadSQL, []string{"Index Scan using projector_tombstones_pkey"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			for _, m := range params.FindAllStringSubmatch(tc.sql, -1) {
				k, _ := strconv.Atoi(m[1])
				n = max(n, k)
			}
			name := "plan_" + strings.ReplaceAll(tc.name, " ", "_")
			if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+tc.sql); err != nil {
				t.Fatalf("prepare: %v", err)
			}
			args := strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ")
			rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+args+")")
			if err != nil {
				t.Fatal(err)
			}
			var plan strings.Builder
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan.WriteString(line + "\n")
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			got := plan.String()
			if strings.Contains(got, "Function Scan") {
				t.Errorf("arrays materialised by a function scan:\n%s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("plan lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
