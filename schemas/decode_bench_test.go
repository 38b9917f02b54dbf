package schemas_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/bench"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/schemas"
)

// BenchmarkDecodeBenchValue decodes the values `projector bench` produces:
// the demo's event written with a padded writer schema (about 200 bytes),
// resolved into the projection's v1 reader schema, the padding skipped.
// One op is one event.
func BenchmarkDecodeBenchValue(b *testing.B) {
	reg := srfake.New()
	defer reg.Close()
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ss, err := cl.CreateSchema(ctx, "bench-value", sr.Schema{Schema: bench.WriterSchema, Type: sr.TypeAvro})
	if err != nil {
		b.Fatal(err)
	}
	reader, err := bench.ReaderSchema()
	if err != nil {
		b.Fatal(err)
	}
	ev := demo.Event{AccountID: "acc-0012345", Version: 7, Type: "Deposited", Amount: 420, OccurredAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, size := range []int{0, 200, 1000} {
		value := bench.AppendValue(nil, ss.ID, ev, size)
		b.Run(fmt.Sprintf("bytes=%d", len(value)), func(b *testing.B) {
			d := schemas.NewDecoder(cl, reader)
			if _, _, err := d.Decode(ctx, value); err != nil { // warm the cache
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				if _, _, err := d.Decode(ctx, value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
