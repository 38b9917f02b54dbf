package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
)

// Event is one domain event to publish: a record of Topic keyed by
// AggregateID, carrying Version, with CloudEvents attributes in its headers.
type Event struct {
	// ID is the event's stable id (CloudEvents id, header ce_id); a random
	// UUIDv4 when empty. It stays the same when the relay publishes the
	// event again after a crash.
	ID string
	// AggregateType names the kind of aggregate ("account"); required.
	AggregateType string
	// AggregateID is the aggregate's id and the record key; required.
	AggregateID string
	// Version is the aggregate's version after this event, 1-based, as
	// the consumer's version gate expects; required (at least 1).
	Version int64
	// Type is the event type (CloudEvents type, header ce_type); required.
	Type string
	// Topic is the Kafka topic; required.
	Topic string

	// Exactly one of Value and Payload.
	//
	// Value is encoded at publish time with the latest schema registered
	// under "<Topic>-value" in the Confluent wire format. It is stored as
	// JSON (encoding/json), so pass a map[string]any keyed by Avro field
	// name, or a struct whose json names are the Avro field names. A
	// timestamp or date field takes a time.Time, a bytes or fixed field a
	// []byte, a decimal a *big.Rat, a time-of-day a time.Duration; a
	// ["null", T] union takes nil or a T, a union of several types a T
	// that fits one of them or {"branch name": T}; a missing field takes
	// its schema default.
	Value any
	// Payload is a value already in the Confluent wire format, produced
	// byte for byte.
	Payload []byte

	// Tenant, when set, becomes the record's "tenant" header.
	Tenant string
	// Source is the CloudEvents source (a URI-reference, header
	// ce_source); "/" + AggregateType when empty.
	Source string
	// Subject is the CloudEvents subject (header ce_subject); AggregateID
	// when empty.
	Subject string
	// Time is when the event happened (header ce_time); now when zero.
	Time time.Time
}

// row is an Event ready to insert.
type row struct {
	id, aggType, aggID   string
	version              int64
	typ, topic           string
	payload              []byte
	value                *string
	tenant               *string
	source, subject      string
	at                   time.Time
	traceparent, tracest *string
}

func (e Event) row(now time.Time) (row, error) {
	r := row{id: e.ID, aggType: e.AggregateType, aggID: e.AggregateID, version: e.Version, typ: e.Type,
		topic: e.Topic, source: e.Source, subject: e.Subject, at: e.Time}
	switch {
	case e.AggregateType == "":
		return r, errors.New("AggregateType is required")
	case e.AggregateID == "":
		return r, errors.New("AggregateID is required: it is the record key")
	case e.Version < 1:
		return r, fmt.Errorf("Version %d: the aggregate version is 1-based", e.Version)
	case e.Type == "":
		return r, errors.New("Type is required: it is the CloudEvents type")
	case e.Topic == "":
		return r, errors.New("Topic is required")
	case (e.Value == nil) == (e.Payload == nil):
		return r, errors.New("exactly one of Value and Payload is required")
	}
	if r.id == "" {
		r.id = uuid.NewString()
	}
	if r.source == "" {
		r.source = "/" + url.PathEscape(e.AggregateType)
	}
	if _, err := url.Parse(r.source); err != nil {
		return r, fmt.Errorf("Source %q is not a URI-reference: %w", r.source, err)
	}
	if r.subject == "" {
		r.subject = e.AggregateID
	}
	if r.at.IsZero() {
		r.at = now
	}
	if e.Tenant != "" {
		r.tenant = &e.Tenant
	}
	if e.Payload != nil {
		r.payload = e.Payload
	} else {
		b, err := json.Marshal(e.Value)
		if err != nil {
			return r, fmt.Errorf("Value: %w", err)
		}
		s := string(b)
		r.value = &s
	}
	return r, nil
}

const insertSQL = `INSERT INTO projector_outbox (id, aggregate_type, aggregate_id, version, event_type, topic,
		payload, value, tenant, source, subject, event_time, traceparent, tracestate)
	SELECT u.id, u.aggregate_type, u.aggregate_id, u.version, u.event_type, u.topic,
		u.payload, u.value::jsonb, u.tenant, u.source, u.subject, u.event_time, $13, $14
	FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
		$7::bytea[], $8::text[], $9::text[], $10::text[], $11::text[], $12::timestamptz[])
		WITH ORDINALITY AS u(id, aggregate_type, aggregate_id, version, event_type, topic,
			payload, value, tenant, source, subject, event_time, ord)
	ORDER BY u.ord`

// Append writes events to the outbox in the caller's transaction tx, in
// the given order (which is their publishing order per aggregate): they
// are published after tx commits, and never if it rolls back. The W3C trace
// context of ctx (traceparent, tracestate) is stored with them and becomes
// their records' headers. One statement inserts all of them.
func Append(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	n := len(events)
	var (
		ids, aggTypes, aggIDs, types, topics, sources, subjects = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		versions                                                = make([]int64, n)
		payloads                                                = make([][]byte, n)
		values, tenants                                         = make([]*string, n), make([]*string, n)
		times                                                   = make([]time.Time, n)
	)
	now := time.Now()
	for i, e := range events {
		r, err := e.row(now)
		if err != nil {
			return fmt.Errorf("outbox: event %d (%s %s v%d): %w", i, e.AggregateType, e.AggregateID, e.Version, err)
		}
		ids[i], aggTypes[i], aggIDs[i], versions[i], types[i], topics[i] = r.id, r.aggType, r.aggID, r.version, r.typ, r.topic
		payloads[i], values[i], tenants[i], sources[i], subjects[i], times[i] = r.payload, r.value, r.tenant, r.source, r.subject, r.at
	}
	traceparent, tracestate := traceContext(ctx)
	if _, err := tx.Exec(ctx, insertSQL, ids, aggTypes, aggIDs, versions, types, topics,
		payloads, values, tenants, sources, subjects, times, traceparent, tracestate); err != nil {
		return fmt.Errorf("outbox: append %d events: %w", n, err)
	}
	return nil
}

// AppendPool writes events in a transaction of its own; see Append.
func AppendPool(ctx context.Context, pool *pgxpool.Pool, events ...Event) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Append(ctx, tx, events...) })
}

// traceContext returns the W3C trace context headers of ctx's span, as the
// OpenTelemetry propagator writes them (nil when ctx carries no valid
// span context).
func traceContext(ctx context.Context) (traceparent, tracestate *string) {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if v := carrier.Get(HeaderTraceparent); v != "" {
		traceparent = &v
	}
	if v := carrier.Get(HeaderTracestate); v != "" {
		tracestate = &v
	}
	return traceparent, tracestate
}
