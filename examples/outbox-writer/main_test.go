package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/schemas"
)

// TestAppendLines: each line becomes an outbox row carrying the trace
// context of its own exported span, which is what lets the trace lead from
// this write through the relay to the projector.
func TestAppendLines(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx) //nolint:errcheck // in-memory
	in := `{"account_id": "acc-1", "version": 1, "type": "AccountOpened", "owner": "alice"}

{"account_id": "acc-1", "version": 2, "type": "Deposited", "owner": null, "amount": 500, "occurred_at": "2026-12-01T09:05:00Z"}
`
	var out bytes.Buffer
	n, err := appendLines(ctx, db.Pool, tp.Tracer("test"), "accounts.events", strings.NewReader(in), &out)
	if err != nil || n != 2 {
		t.Fatalf("appendLines: %d, %v", n, err)
	}
	got := spans.GetSpans()
	if len(got) != 2 {
		t.Fatalf("%d spans exported, want 2", len(got))
	}
	rows, err := db.Pool.Query(ctx, `SELECT aggregate_id, version, event_type, topic, traceparent, value->>'amount', value ? 'occurred_at'
		FROM projector_outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	i := 0
	for ; rows.Next(); i++ {
		var (
			id, typ, topic, traceparent string
			version                     int64
			amount                      *string
			hasTime                     bool
		)
		if err := rows.Scan(&id, &version, &typ, &topic, &traceparent, &amount, &hasTime); err != nil {
			t.Fatal(err)
		}
		if i >= len(got) {
			break
		}
		sc := got[i].SpanContext
		// What the relay turns into the record's headers.
		carrier := propagation.MapCarrier{"traceparent": traceparent}
		stored := propagation.TraceContext{}.Extract(ctx, carrier)
		if id != "acc-1" || version != int64(i+1) || topic != "accounts.events" || !hasTime {
			t.Errorf("row %d: %s v%d %s on %s, occurred_at set %v", i, id, version, typ, topic, hasTime)
		}
		if want := "append " + typ; got[i].Name != want {
			t.Errorf("row %d: span %q, want %q", i, got[i].Name, want)
		}
		if s := trace.SpanContextFromContext(stored); s.TraceID() != sc.TraceID() || s.SpanID() != sc.SpanID() {
			t.Errorf("row %d: traceparent %q, want the span's %s/%s", i, traceparent, sc.TraceID(), sc.SpanID())
		}
		if !strings.Contains(out.String(), sc.TraceID().String()) {
			t.Errorf("output does not name trace %s:\n%s", sc.TraceID(), out.String())
		}
		if i == 1 && (amount == nil || *amount != "500") {
			t.Errorf("row 1: amount %v, want 500", amount)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if i != 2 {
		t.Errorf("%d outbox rows, want 2", i)
	}
	rows.Close()

	// The relay encodes the values with the compose stack's schema and
	// publishes them with the spans' trace context.
	kafka := testenv.Kafka(t, "accounts.events", 1)
	_, reg := testenv.Registry(t)
	schema, err := os.ReadFile(filepath.Join("..", "..", "internal", "demo", "account_event.avsc"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := schemas.Register(ctx, reg, "accounts.events-value", string(schema)); err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	relay, err := outbox.New(db.Pool, outbox.Config{Client: producer, Registry: reg, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-relayDone; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	consumer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ConsumeTopics("accounts.events"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	avsc := avro.MustParse(string(schema))
	var records []*kgo.Record
	testenv.WaitFor(t, 30*time.Second, func() error {
		fctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		records = append(records, consumer.PollFetches(fctx).Records()...)
		if len(records) < 2 {
			return fmt.Errorf("%d of 2 records published", len(records))
		}
		return nil
	})
	for i, r := range records {
		var ev struct {
			AccountID  string    `avro:"account_id"`
			Version    int64     `avro:"version"`
			Amount     int64     `avro:"amount"`
			OccurredAt time.Time `avro:"occurred_at"`
		}
		if len(r.Value) < 5 {
			t.Fatalf("record %d: value of %d bytes is not in the wire format", i, len(r.Value))
		}
		if err := avro.Unmarshal(avsc, r.Value[5:], &ev); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if ev.AccountID != "acc-1" || ev.Version != int64(i+1) || string(r.Key) != "acc-1" {
			t.Errorf("record %d: key %q, value %+v", i, r.Key, ev)
		}
		// The time a line gives is kept; without one, the time of writing.
		if i == 1 && (ev.Amount != 500 || !ev.OccurredAt.Equal(time.Date(2026, 12, 1, 9, 5, 0, 0, time.UTC))) {
			t.Errorf("record 1: amount %d at %s, want 500 at 2026-12-01T09:05:00Z", ev.Amount, ev.OccurredAt)
		}
		if i == 0 && time.Since(ev.OccurredAt) > time.Hour {
			t.Errorf("record 0: occurred_at %s, want the time of writing", ev.OccurredAt)
		}
		var traceparent string
		for _, h := range r.Headers {
			if h.Key == "traceparent" {
				traceparent = string(h.Value)
			}
		}
		if want := got[i].SpanContext.TraceID().String(); !strings.Contains(traceparent, want) {
			t.Errorf("record %d: traceparent %q, want trace %s", i, traceparent, want)
		}
	}
}

// TestAppendLinesRefusesBadLine: a bad line is named and nothing is
// written, not even the lines before it.
func TestAppendLinesRefusesBadLine(t *testing.T) {
	ctx := t.Context()
	db := testenv.NewDB(t)
	if err := outbox.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx) //nolint:errcheck // nothing exported
	in := `{"account_id": "acc-1", "version": 1, "type": "AccountOpened"}
{"account_id": "acc-1", "version": 0, "type": "Deposited"}
`
	_, err := appendLines(ctx, db.Pool, tp.Tracer("test"), "accounts.events", strings.NewReader(in), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "version 0") {
		t.Fatalf("error %v, want one naming line 2 and its version", err)
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_outbox`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("%d outbox rows (err %v), want 0", rows, err)
	}
}
