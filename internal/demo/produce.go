package demo

import (
	"context"
	"fmt"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/projector-dev/projector/schemas"
)

// Encoder turns demo events into Confluent wire-format values, half of
// them with the evolved (v2) writer schema.
type Encoder struct {
	// Topic is where Produce writes: Topic unless RegisterSchemasFor
	// named another.
	Topic   string
	ids     [2]int
	schemas [2]avro.Schema
}

// RegisterSchemas registers the demo's schemas (v1, then the compatible
// v2) under the value subject of the demo's topic and returns an encoder
// for them.
func RegisterSchemas(ctx context.Context, cl *sr.Client) (*Encoder, error) {
	return RegisterSchemasFor(ctx, cl, Topic)
}

// RegisterSchemasFor is RegisterSchemas for the demo's stream on another
// topic.
func RegisterSchemasFor(ctx context.Context, cl *sr.Client, topic string) (*Encoder, error) {
	files, err := Schemas()
	if err != nil {
		return nil, err
	}
	texts := []string{files["account_event"], files["account_event_v2"]}
	ids, err := schemas.Register(ctx, cl, topic+"-value", texts...)
	if err != nil {
		return nil, fmt.Errorf("register demo schemas: %w", err)
	}
	e := &Encoder{Topic: topic}
	for i, t := range texts {
		s, err := avro.Parse(t)
		if err != nil {
			return nil, fmt.Errorf("parse demo schema: %w", err)
		}
		e.ids[i], e.schemas[i] = ids[i], s
	}
	return e, nil
}

// ReaderSchema is the schema the demo projection reads with (v1).
func (e *Encoder) ReaderSchema() avro.Schema { return e.schemas[0] }

// Encode returns the record value of r: nil for a tombstone.
func (e *Encoder) Encode(r Record) ([]byte, error) {
	if r.Tombstone {
		return nil, nil
	}
	if r.Poison != "" {
		return r.Raw, nil
	}
	ev := r.Event
	v := map[string]any{
		"account_id":  ev.AccountID,
		"version":     ev.Version,
		"type":        ev.Type,
		"owner":       nil,
		"amount":      ev.Amount,
		"occurred_at": ev.OccurredAt,
	}
	if ev.Owner != "" {
		v["owner"] = ev.Owner
	}
	i := 0
	if ev.V2 {
		i = 1
		v["currency"] = "EUR"
	}
	return schemas.AppendWire(nil, e.ids[i], e.schemas[i], v)
}

// Produce writes the records to the encoder's topic in order, keyed by account, and
// waits until every one is acknowledged. progress, if not nil, is called
// after each acknowledged chunk with the count so far.
func Produce(ctx context.Context, cl *kgo.Client, enc *Encoder, records []Record, progress func(done int)) error {
	const chunk = 10_000
	for start := 0; start < len(records); start += chunk {
		end := min(start+chunk, len(records))
		batch := make([]*kgo.Record, 0, end-start)
		for _, r := range records[start:end] {
			value, err := enc.Encode(r)
			if err != nil {
				return fmt.Errorf("encode %s v%d: %w", r.Key, r.Event.Version, err)
			}
			var key []byte // a record without a key has a null one
			if r.Key != "" {
				key = []byte(r.Key)
			}
			batch = append(batch, &kgo.Record{Topic: enc.Topic, Key: key, Value: value})
		}
		if err := cl.ProduceSync(ctx, batch...).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		if progress != nil {
			progress(end)
		}
	}
	return nil
}
