package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// With an OTLP endpoint set, `projector run` exports a span per batch:
// the tracer provider the environment configures reaches the engine.
func TestRunExportsBatchSpans(t *testing.T) {
	var (
		mu     sync.Mutex
		bodies [][]byte
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" {
			mu.Lock()
			bodies = append(bodies, b)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	e := newRunEnv(t, 2, 200)
	r := start(t, e.args("traced")...)
	e.verify(t, "traced", time.Minute, r.out)
	r.stop()
	if err := r.exited(t, 30*time.Second); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run did not stop cleanly: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bodies {
		// Span names are plain strings in the protobuf encoding.
		if bytes.Contains(b, []byte("process ")) && bytes.Contains(b, []byte("commit batch")) {
			return
		}
	}
	t.Fatalf("the collector received %d exports, none with a batch's spans", len(bodies))
}
