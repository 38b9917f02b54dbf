package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/schemas"
)

// TestExampleFilesLoad: every projection file under examples/ is one
// projector accepts, so that none can rot.
func TestExampleFilesLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("examples: %d projection files, want projections.yaml, snapshot.yaml and saga.yaml", len(files))
	}
	for _, f := range files {
		if _, err := projection.Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// sagaStep is one event of examples/saga.yaml's stream.
type sagaStep struct {
	order   string
	version int64
	typ     string
	fields  map[string]any
}

// sagaRow is what order_sagas holds for one saga.
type sagaRow struct {
	status, customer, payment, failure string
	amount, refunded, version          int64
}

// foldSagas is the reference fold of the saga stream: per order, versions
// applied in order from 1, duplicates ignored, versions after a gap never
// applied; the verbs as examples/saga.yaml declares them.
func foldSagas(steps []sagaStep) map[string]sagaRow {
	byOrder := map[string]map[int64]sagaStep{}
	for _, s := range steps {
		if byOrder[s.order] == nil {
			byOrder[s.order] = map[int64]sagaStep{}
		}
		byOrder[s.order][s.version] = s
	}
	out := map[string]sagaRow{}
	for order, vs := range byOrder {
		var row *sagaRow
		for v := int64(1); ; v++ {
			s, ok := vs[v]
			if !ok {
				break
			}
			if row == nil {
				row = &sagaRow{}
			}
			row.version = v
			str := func(name string) string { x, _ := s.fields[name].(string); return x }
			switch s.typ {
			case "SagaStarted":
				row.status, row.customer, row.amount = "started", str("customer_id"), s.fields["amount_cents"].(int64)
			case "PaymentReserved":
				row.status, row.payment = "payment_reserved", str("payment_id")
			case "StockReserved":
				row.status = "stock_reserved"
			case "StockUnavailable":
				row.status, row.failure = "compensating", str("reason")
			case "PaymentRefunded":
				row.status = "compensated"
				row.refunded += s.fields["amount_cents"].(int64)
			case "OrderConfirmed":
				row.status = "completed"
			case "SagaArchived":
				row = nil
			}
			if row == nil {
				break
			}
		}
		if row != nil {
			out[order] = *row
		}
	}
	return out
}

// TestSagaExample runs examples/saga.yaml with projector run on a stream
// of sagas (completed, compensated, archived, one still waiting for a
// step), delivered with duplicates and out of order, and compares the
// table with the reference fold of what was produced.
func TestSagaExample(t *testing.T) {
	ctx := t.Context()
	const topic = "orders.saga"
	db := testenv.NewDB(t)
	kafka := testenv.Kafka(t, topic, 3)
	fake, reg := testenv.Registry(t)
	avsc, err := os.ReadFile(filepath.Join("..", "..", "examples", "saga.avsc"))
	if err != nil {
		t.Fatal(err)
	}
	schema, err := avro.Parse(string(avsc))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := reg.CreateSchema(ctx, topic+"-value", sr.Schema{Schema: string(avsc)})
	if err != nil {
		t.Fatal(err)
	}

	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var steps []sagaStep
	saga := func(order string, types ...string) {
		for i, typ := range types {
			f := map[string]any{}
			switch typ {
			case "SagaStarted":
				f["customer_id"], f["amount_cents"] = "cust-"+order, int64(1000+len(order))
			case "PaymentReserved":
				f["payment_id"] = "pay-" + order
			case "StockUnavailable":
				f["reason"] = "out of stock"
			case "PaymentRefunded":
				f["amount_cents"] = int64(1000 + len(order))
			}
			steps = append(steps, sagaStep{order, int64(i + 1), typ, f})
		}
	}
	saga("o-1", "SagaStarted", "PaymentReserved", "StockReserved", "OrderConfirmed")
	saga("o-2", "SagaStarted", "PaymentReserved", "StockUnavailable", "PaymentRefunded")
	saga("o-3", "SagaStarted", "PaymentReserved", "StockReserved", "OrderConfirmed", "SagaArchived")
	saga("o-4", "SagaStarted", "PaymentReserved")
	saga("o-55", "SagaStarted", "PaymentReserved", "StockUnavailable")
	// A step delivered twice, and two steps that arrive in the wrong order:
	// the version gate ignores the copy and waits for the earlier step.
	log := slices.Clone(steps)
	log = append(log, steps[1])
	i, j := 4, 5 // o-2's first two steps
	log[i], log[j] = log[j], log[i]
	// o-6 is waiting for its second step, which never comes.
	saga("o-6", "SagaStarted", "PaymentReserved", "StockReserved")
	log = append(log, steps[len(steps)-3], steps[len(steps)-1])

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for n, s := range log {
		v := map[string]any{"order_id": s.order, "version": s.version, "type": s.typ,
			"occurred_at": at.Add(time.Duration(n) * time.Second),
			"customer_id": nil, "amount_cents": nil, "payment_id": nil, "reason": nil}
		maps.Copy(v, s.fields)
		value, err := schemas.AppendWire(nil, ss.ID, schema, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(s.order), Value: value}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	end, err := demo.EndOffsets(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Main(runCtx, []string{"run", "--brokers", kafka.ListenAddrs()[0], "--registry-url", fake.URL(),
			"--database-url", db.URL, "--identity", "sagas", "--http-addr", "", "--log-level", "warn",
			"--config", filepath.Join("..", "..", "examples", "saga.yaml")}, &out, &out)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, out.String())
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, db.Pool, "sagas", topic, end, nil); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}

	rows, err := db.Pool.Query(ctx, `SELECT order_id, status, coalesce(customer_id, ''), coalesce(payment_id, ''),
		coalesce(failure, ''), amount_cents, refunded_cents, version FROM order_sagas`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]sagaRow{}
	for rows.Next() {
		var id string
		var r sagaRow
		if err := rows.Scan(&id, &r.status, &r.customer, &r.payment, &r.failure, &r.amount, &r.refunded, &r.version); err != nil {
			t.Fatal(err)
		}
		got[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := foldSagas(log)
	if len(want) != 5 || want["o-6"].status != "started" || want["o-2"].status != "compensated" {
		t.Fatalf("the reference fold is not the stream this test means to produce: %+v", want)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("order_sagas:\n got %+v\nwant %+v", got, want)
	}
	var parked int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_parked WHERE identity = 'sagas'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 1 {
		t.Fatalf("%d events parked, want o-6's third step waiting for its second", parked)
	}
}
