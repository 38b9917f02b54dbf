package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/outbox"
	"github.com/projector-dev/projector/partition"
	"github.com/projector-dev/projector/projector"
)

// TestBatchSpansLinkToProducers produces records carrying a producer's
// traceparent; the batch that applies them is a "process" consumer span
// linked to that producer span, with messaging attributes, and the
// Postgres commit is its child.
func TestBatchSpansLinkToProducers(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 1)
	producerTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	produceTraced(t, f, producerTrace.String(), producerTrace.String())

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx) //nolint:errcheck // in-memory
	run(t, f.engine(t, "traced", projector.Config{TracerProvider: tp}))
	f.verify(t, "traced")

	var process, commit *tracetest.SpanStub
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the batch spans", func() bool {
		for _, s := range spans.GetSpans() {
			switch s.Name {
			case "process " + demo.Topic:
				process = &s
			case "commit batch":
				commit = &s
			}
		}
		return process != nil && commit != nil
	}))
	if process.SpanKind != trace.SpanKindConsumer {
		t.Errorf("process span kind %v, want consumer", process.SpanKind)
	}
	linked := false
	for _, l := range process.Links {
		linked = linked || l.SpanContext.TraceID() == producerTrace
	}
	if !linked {
		t.Errorf("process span links %v, want one to the producer trace %s", process.Links, producerTrace)
	}
	want := map[attribute.Key]string{
		"messaging.system":                   "kafka",
		"messaging.operation.type":           "process",
		"messaging.destination.name":         demo.Topic,
		"messaging.destination.partition.id": "0",
		"messaging.consumer.group.name":      "traced",
	}
	got := map[attribute.Key]string{}
	for _, a := range process.Attributes {
		got[a.Key] = a.Value.Emit()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("process span attribute %s = %q, want %q", k, got[k], v)
		}
	}
	if commit.Parent.SpanID() != process.SpanContext.SpanID() {
		t.Errorf("commit span's parent %s, want the process span %s", commit.Parent.SpanID(), process.SpanContext.SpanID())
	}
}

// TestTraceAcrossOutbox writes an event through the outbox inside a
// traced request; after the relay publishes it, the projector's process
// span links to that request's trace.
func TestTraceAcrossOutbox(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 1)
	if err := outbox.Migrate(ctx, f.db.Pool); err != nil {
		t.Fatal(err)
	}
	requestTrace, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	requestSpan, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	reqCtx := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: requestTrace, SpanID: requestSpan, TraceFlags: trace.FlagsSampled,
	}))
	rec := demo.Record{Key: "outboxed-1", Event: demo.Event{AccountID: "outboxed-1", Version: 1, Type: "AccountOpened", Owner: "o"}}
	value, err := f.enc.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.AppendPool(reqCtx, f.db.Pool, outbox.Event{
		AggregateType: "account", AggregateID: rec.Key, Version: 1, Type: "AccountOpened", Topic: demo.Topic, Payload: value,
	}); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.New(f.db.Pool, outbox.Config{Client: f.kafkaClient(t), Registry: f.reg, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() {
		cancel()
		<-relayDone
	}()

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx) //nolint:errcheck // in-memory
	run(t, f.engine(t, "outboxed", projector.Config{TracerProvider: tp}))
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("a process span linked to the request's trace", func() bool {
		for _, s := range spans.GetSpans() {
			for _, l := range s.Links {
				if s.Name == "process "+demo.Topic && l.SpanContext.TraceID() == requestTrace && l.SpanContext.SpanID() == requestSpan {
					return true
				}
			}
		}
		return false
	}))
	var owner string
	if err := f.db.Pool.QueryRow(ctx, `SELECT owner FROM accounts WHERE account_id = 'outboxed-1'`).Scan(&owner); err != nil || owner != "o" {
		t.Errorf("outboxed-1: owner %q (err %v), want o", owner, err)
	}
}

// TestTransactionSpanLinksEveryBatch has a member behind by two batches of
// one record, from two producer traces: the one transaction covering both
// is one "process" span linked to both producers, counting both records.
func TestTransactionSpanLinksEveryBatch(t *testing.T) {
	ctx := t.Context()
	f := faultSetup(t, demo.Options{Aggregates: 1, MeanEvents: 1}, 1)
	traces := []string{"4bf92f3577b34da6a3ce929d0e0e4736", "5cf92f3577b34da6a3ce929d0e0e4737"}
	produceTraced(t, f, traces...)

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx) //nolint:errcheck // in-memory
	reg := prometheus.NewRegistry()
	run(t, f.engine(t, "traced", projector.Config{TracerProvider: tp, Registerer: reg,
		Partition: partition.Config{BatchMaxRecords: 1}}))
	f.verify(t, "traced")
	if commits, batches := counter(t, reg, "projector_commit_batches"), histogramSum(t, reg, "projector_commit_batches"); commits != 1 || batches != 2 {
		t.Fatalf("%.0f batches in %.0f transactions: want both in one", batches, commits)
	}
	var process *tracetest.SpanStub
	testenv.WaitFor(t, 10*time.Second, testenv.Holds("the transaction's span", func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name == "process "+demo.Topic {
				process = &s
			}
		}
		return process != nil
	}))
	linked := map[string]bool{}
	for _, l := range process.Links {
		linked[l.SpanContext.TraceID().String()] = true
	}
	for _, tr := range traces {
		if !linked[tr] {
			t.Errorf("process span links %v: none to the producer trace %s", process.Links, tr)
		}
	}
	for _, a := range process.Attributes {
		if a.Key == "messaging.batch.message_count" && a.Value.AsInt64() != 2 {
			t.Errorf("messaging.batch.message_count %d, want 2", a.Value.AsInt64())
		}
	}
}

// produceTraced produces version 1 and 2 of one account, each carrying a
// traceparent of the producer trace given for it.
func produceTraced(t *testing.T, f *faultBundle, traces ...string) {
	t.Helper()
	ctx := t.Context()
	records := []demo.Record{
		{Key: "traced-1", Event: demo.Event{AccountID: "traced-1", Version: 1, Type: "AccountOpened", Owner: "o"}},
		{Key: "traced-1", Event: demo.Event{AccountID: "traced-1", Version: 2, Type: "Deposited", Amount: 3}},
	}
	var krecs []*kgo.Record
	for i, r := range records {
		v, err := f.enc.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		krecs = append(krecs, &kgo.Record{Topic: demo.Topic, Key: []byte(r.Key), Value: v, Headers: []kgo.RecordHeader{
			{Key: "traceparent", Value: []byte("00-" + traces[i] + "-00f067aa0ba902b7-01")},
		}})
	}
	cl := f.kafkaClient(t)
	if err := cl.ProduceSync(ctx, krecs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.end, err = demo.EndOffsets(ctx, kadm.NewClient(cl), demo.Topic); err != nil {
		t.Fatal(err)
	}
	f.records = records
}
