package main

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracing builds a tracer provider from the standard OTEL_* environment
// variables. Tracing is off unless OTEL_TRACES_EXPORTER names an exporter
// (otlp, console) or an OTLP endpoint is set; then spans are exported
// through OpenTelemetry's autoexport (OTLP over http/protobuf by default,
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc for gRPC). The service name comes from
// OTEL_SERVICE_NAME (default "projector"). shutdown flushes and stops.
func tracing(ctx context.Context) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	exporter := os.Getenv("OTEL_TRACES_EXPORTER")
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") + os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if exporter == "none" || (exporter == "" && endpoint == "") {
		return nil, noop, nil
	}
	if os.Getenv("OTEL_SERVICE_NAME") == "" {
		os.Setenv("OTEL_SERVICE_NAME", "projector")
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, noop, fmt.Errorf("OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_*: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	return sdk, sdk.Shutdown, nil
}
