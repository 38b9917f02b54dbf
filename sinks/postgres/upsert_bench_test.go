package postgres

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

// benchRows returns n rows of the demo's accounts fold projection as the
// fold leaves them (opened_at in text form, as Column.Convert holds a
// timestamptz).
func benchRows(b *testing.B, n int) (*Sink, []sinks.RowWrite) {
	b.Helper()
	projs, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		b.Fatal(err)
	}
	s := NewSink(nil, "bench", projs[0], "")
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339Nano)
	rows := make([]sinks.RowWrite, n)
	for i := range rows {
		key := fmt.Sprintf("acc-%07d", i)
		rows[i] = sinks.RowWrite{Key: key, Version: int64(i%20 + 1), Row: projection.Row{
			"account_id": key, "owner": fmt.Sprintf("owner %d", i), "balance": int64(i * 37), "opened_at": at,
		}}
	}
	return s, rows
}

// perRow reports allocations and bytes per row of the batch, which is what
// the engine pays per aggregate written.
func perRow(b *testing.B, rows int, f func()) {
	b.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		f()
		n++
	}
	runtime.ReadMemStats(&after)
	total := float64(n * rows)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/row")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/total, "allocs/row")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/total, "B/row")
}

// BenchmarkUpsertArgs is the batch builder: the arrays of one set-based
// upsert of a batch's changed rows, encoded as pgx sends them. The
// text-arrays case is the baseline: every value as text in a []*string,
// which pgx encodes by reflection.
func BenchmarkUpsertArgs(b *testing.B) {
	m := pgtype.NewMap()
	oidOf := map[string]uint32{"text[]": pgtype.TextArrayOID, "int8[]": pgtype.Int8ArrayOID,
		"float8[]": pgtype.Float8ArrayOID, "bool[]": pgtype.BoolArrayOID, "timestamptz[]": pgtype.TimestamptzArrayOID}
	for _, n := range []int{100, 1000} {
		s, rows := benchRows(b, n)
		var oids []uint32
		for i, c := range s.p.Columns {
			for _, typ := range newColumn(c, i == 0, 0).sqlTypes() {
				oids = append(oids, oidOf[typ])
			}
		}
		oids = append(oids, pgtype.Int8ArrayOID)
		encode := func(args []any, oids []uint32) {
			var buf []byte
			for i, a := range args {
				var err error
				if buf, err = m.Encode(oids[i], pgtype.BinaryFormatCode, a, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			perRow(b, n, func() {
				args, err := s.upsertArgs(rows, 0, nil)
				if err != nil {
					b.Fatal(err)
				}
				encode(args, oids)
			})
		})
		b.Run(fmt.Sprintf("text-arrays/rows=%d", n), func(b *testing.B) {
			textOIDs := make([]uint32, len(s.p.Columns)+1)
			for i := range textOIDs {
				textOIDs[i] = pgtype.TextArrayOID
			}
			textOIDs[len(textOIDs)-1] = pgtype.Int8ArrayOID
			b.ReportAllocs()
			perRow(b, n, func() {
				arrays := make([][]*string, len(s.p.Columns))
				versions := make([]int64, len(rows))
				for i := range arrays {
					arrays[i] = make([]*string, len(rows))
				}
				for r, w := range rows {
					versions[r] = w.Version
					for i, c := range s.p.Columns {
						v, err := c.EncodeText(w.Row[c.Name])
						if err != nil {
							b.Fatal(err)
						}
						arrays[i][r] = v
					}
				}
				args := make([]any, 0, len(arrays)+1)
				for _, a := range arrays {
					args = append(args, a)
				}
				encode(append(args, versions), textOIDs)
			})
		})
	}
}

// BenchmarkQueueChanges is everything the sink builds in Go for a batch's
// write pipeline: upserts, deletes with their tombstones, and the fenced
// offset update, queued on a pgx.Batch (no Postgres involved).
func BenchmarkQueueChanges(b *testing.B) {
	const n = 1000
	s, rows := benchRows(b, n)
	var dels []sinks.RowDelete
	for i := 0; i < n/20; i++ {
		dels = append(dels, sinks.RowDelete{Key: fmt.Sprintf("acc-x%06d", i), Version: 7})
	}
	ch := sinks.Changes{Upserts: rows, Deletes: dels}
	tp := sinks.TP{Topic: demo.Topic, Partition: 3}
	b.ReportAllocs()
	perRow(b, n, func() {
		batch := &pgx.Batch{}
		if _, err := s.queueChanges(batch, tp, ch, upsertGroups{absent: len(rows)}, nil); err != nil {
			b.Fatal(err)
		}
		batch.Queue(advanceSQL, int64(2000), s.identity, tp.Topic, tp.Partition, int64(1), int64(1000))
	})
}
