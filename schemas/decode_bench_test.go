package schemas_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
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
	cl := registry(b)
	ctx := b.Context()
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
		// Into values, as a worker decodes for a compiled fold: the
		// baseline above is the map per event it decoded into before.
		b.Run(fmt.Sprintf("bytes=%d/values", len(value)), func(b *testing.B) {
			d := schemas.NewDecoder(cl, reader)
			vals := make([]any, d.Width())
			if names, _, _, err := d.DecodeValues(ctx, value, vals); err != nil || names == nil {
				b.Fatalf("names %v, error %v: want the record decoded into values", names, err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				if _, _, _, err := d.DecodeValues(ctx, value, vals); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeWide decodes an event of 30 fields, as services often
// publish them, for a projection that reads 4 of them: through the whole
// reader schema and through the one pruned to the fields read (as
// `projector run` decodes for declarative projections).
func BenchmarkDecodeWide(b *testing.B) {
	cl := registry(b)
	ctx := b.Context()
	var fields []string
	value := map[string]any{}
	for i := range 30 {
		name := fmt.Sprintf("f%02d", i)
		if i%2 == 0 {
			fields = append(fields, fmt.Sprintf(`{"name": %q, "type": "string"}`, name))
			value[name] = fmt.Sprintf("value of field %d", i)
		} else {
			fields = append(fields, fmt.Sprintf(`{"name": %q, "type": "long"}`, name))
			value[name] = int64(i * 1000)
		}
	}
	text := `{"type": "record", "name": "Wide", "fields": [` + strings.Join(fields, ", ") + `]}`
	ids, err := schemas.Register(ctx, cl, "wide-value", text)
	if err != nil {
		b.Fatal(err)
	}
	reader, err := avro.Parse(text)
	if err != nil {
		b.Fatal(err)
	}
	wire, err := schemas.AppendWire(nil, ids[0], reader, value)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range []struct {
		name   string
		reader avro.Schema
	}{
		{"whole-reader", reader},
		{"pruned-to-4", schemas.Prune(reader, []string{"f00", "f01", "f02", "f03"})},
	} {
		b.Run(r.name, func(b *testing.B) {
			d := schemas.NewDecoder(cl, r.reader)
			if _, _, err := d.Decode(ctx, wire); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := d.Decode(ctx, wire); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// registry returns a client of a fresh in-process registry.
func registry(b *testing.B) *sr.Client {
	b.Helper()
	reg := srfake.New()
	b.Cleanup(reg.Close)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		b.Fatal(err)
	}
	return cl
}
