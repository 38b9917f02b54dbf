package partition

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/sinks"
)

var traceContext = propagation.TraceContext{}

// startSpan starts the batch's consumer span, linked to the producer
// context each record carries in its traceparent header.
func (w *Worker) startSpan(ctx context.Context, recs []*kgo.Record) (context.Context, trace.Span) {
	if w.cfg.Tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span
	}
	return w.cfg.Tracer.Start(ctx, "process "+w.claim.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(producerLinks(recs)...),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", w.claim.Topic),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(w.claim.Partition))),
			attribute.String("messaging.consumer.group.name", w.group),
			attribute.Int("messaging.batch.message_count", len(recs)),
		))
}

// endSpan ends a batch's span, recording *err when set.
func endSpan(span trace.Span, err *error) {
	if *err != nil {
		span.RecordError(*err)
		span.SetStatus(codes.Error, (*err).Error())
	}
	span.End()
}

// linkSpan links the batch's span to the producer contexts of recs too.
func (w *Worker) linkSpan(span trace.Span, recs []*kgo.Record) {
	if w.cfg.Tracer == nil {
		return
	}
	for _, l := range producerLinks(recs) {
		span.AddLink(l)
	}
}

// producerLinks links to the producer context each record carries in its
// traceparent header.
func producerLinks(recs []*kgo.Record) []trace.Link {
	links := make([]trace.Link, 0, len(recs))
	for _, r := range recs {
		sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), kotel.NewRecordCarrier(r)))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// traceID returns the trace id of the record's W3C traceparent header.
func traceID(headers []sinks.Header) string {
	carrier := propagation.MapCarrier{}
	for _, h := range headers {
		if h.Key == "traceparent" || h.Key == "tracestate" {
			carrier[h.Key] = string(h.Value)
		}
	}
	if len(carrier) == 0 {
		return ""
	}
	sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
