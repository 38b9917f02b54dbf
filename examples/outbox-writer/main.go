// Command outbox-writer stands in, in the local Docker Compose stack, for a
// service that publishes its events through the transactional outbox: each
// JSON line on standard input is one account event (the fields of
// internal/demo/account_event.avsc, occurred_at defaulting to now), which it
// appends to projector_outbox inside a traced request of its own. projector
// relay then publishes it with that request's trace context as the record's
// traceparent header, and projector run links its batch's span to it, so
// one trace leads from the write to the commit.
//
//	DATABASE_URL=postgres://… OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 outbox-writer < events.jsonl
//
// The topic is accounts.events unless TOPIC says otherwise; tracing is
// configured by the standard OTEL_* variables and off without them.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projector-dev/projector/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-writer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, in io.Reader, out io.Writer) error {
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is not set")
	}
	topic := os.Getenv("TOPIC")
	if topic == "" {
		topic = "accounts.events"
	}
	var tp trace.TracerProvider = noop.NewTracerProvider()
	if os.Getenv("OTEL_TRACES_EXPORTER") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return fmt.Errorf("OTEL_*: %w", err)
		}
		sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		// The spans must leave before the process does, or the trace
		// shows the consumer's side only.
		defer sdk.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // best effort at exit
		tp = sdk
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	n, err := appendLines(ctx, pool, tp.Tracer("outbox-writer"), topic, in, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "appended %d events to the outbox for topic %s\n", n, topic)
	return nil
}

// appendLines appends one outbox event per non-blank line of in, each in
// a span of its own, and prints each event's trace id. Every line is
// checked before the first is written, so that a bad line writes nothing.
func appendLines(ctx context.Context, pool *pgxpool.Pool, tracer trace.Tracer, topic string, in io.Reader, out io.Writer) (int, error) {
	var events []outbox.Event
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		ev, err := event(topic, line)
		if err != nil {
			return 0, fmt.Errorf("line %d: %w", n, err)
		}
		events = append(events, ev)
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading the events: %w", err)
	}
	for _, ev := range events {
		ctx, span := tracer.Start(ctx, "append "+ev.Type, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.operation.type", "create"),
				attribute.String("messaging.destination.name", ev.Topic),
				attribute.String("messaging.message.id", ev.ID),
				attribute.String("account_id", ev.AggregateID),
				attribute.Int64("version", ev.Version),
			))
		err := outbox.AppendPool(ctx, pool, ev)
		span.End()
		if err != nil {
			return 0, fmt.Errorf("%s v%d: %w", ev.AggregateID, ev.Version, err)
		}
		fmt.Fprintf(out, "%s v%d %s: trace %s\n", ev.AggregateID, ev.Version, ev.Type, span.SpanContext().TraceID())
	}
	return len(events), nil
}

// event is the outbox event of one input line.
func event(topic string, line []byte) (outbox.Event, error) {
	var v struct {
		AccountID string `json:"account_id"`
		Version   int64  `json:"version"`
		Type      string `json:"type"`
	}
	if err := json.Unmarshal(line, &v); err != nil {
		return outbox.Event{}, err
	}
	var value map[string]any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber() // versions and amounts stay exact
	if err := dec.Decode(&value); err != nil {
		return outbox.Event{}, err
	}
	// The event's time is its CloudEvents time too.
	at := time.Now()
	switch t := value["occurred_at"].(type) {
	case nil:
		value["occurred_at"] = at
	case string:
		parsed, err := time.Parse(time.RFC3339Nano, t)
		if err != nil {
			return outbox.Event{}, fmt.Errorf("occurred_at: %w", err)
		}
		at = parsed
	}
	switch {
	case v.AccountID == "":
		return outbox.Event{}, errors.New("account_id is missing: it is the aggregate and the record key")
	case v.Version < 1:
		return outbox.Event{}, fmt.Errorf("version %d: the account's version is 1-based", v.Version)
	case v.Type == "":
		return outbox.Event{}, errors.New("type is missing")
	}
	return outbox.Event{
		ID: uuid.NewString(), AggregateType: "account", AggregateID: v.AccountID, Version: v.Version, Type: v.Type,
		Topic: topic, Value: value, Source: "/accounts-service", Time: at,
	}, nil
}
