package postgres_test

import (
	"fmt"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// BenchmarkCommitBatch commits batches of 100 upserts of one partition,
// one after another: the commit path as a worker runs it. caught_up
// marks each commit as reaching the high watermark (the offset UPDATE
// then also records when), behind does not.
func BenchmarkCommitBatch(b *testing.B) {
	for _, caughtUp := range []bool{false, true} {
		name := "behind"
		if caughtUp {
			name = "caught_up"
		}
		b.Run(name, func(b *testing.B) { benchCommit(b, caughtUp) })
	}
}

func benchCommit(b *testing.B, caughtUp bool) {
	ctx := b.Context()
	db := testenv.NewDB(b)
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		b.Fatal(err)
	}
	p := ps[0]
	if err := postgres.Migrate(ctx, db.Pool, p); err != nil {
		b.Fatal(err)
	}
	offs := postgres.NewOffsets(db.Pool, identity)
	sink := postgres.NewSink(db.Pool, identity, p, "")
	cs, err := offs.Claim(ctx, []sinks.TP{{Topic: p.Topic, Partition: 0}})
	if err != nil {
		b.Fatal(err)
	}
	if err := offs.Init(ctx, cs[0], 0); err != nil {
		b.Fatal(err)
	}
	claim := sinks.Claim{TP: cs[0].TP, Epoch: cs[0].Epoch, Since: cs[0].At, CaughtUp: caughtUp}
	const rows, keys = 100, 1000
	versions := map[string]int64{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ch := sinks.Changes{Upserts: make([]sinks.RowWrite, rows)}
		all := make([]string, rows)
		for j := range rows {
			key := fmt.Sprintf("acc-%d", (i*rows+j)%keys)
			versions[key]++
			all[j] = key
			ch.Upserts[j] = upsert(key, versions[key], "o", int64(j))
		}
		end := claim.NextOffset + rows
		if err := sink.CommitBatch(ctx, claim, end, sinks.Keys{All: all}, func(sinks.State) (sinks.Changes, error) { return ch, nil }); err != nil {
			b.Fatal(err)
		}
		claim.NextOffset = end
	}
	b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
}
