package outbox

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Headers of every published record: the W3C trace context stored with
// the event (not the relay's), the CloudEvents attributes in the Kafka
// protocol binding's binary mode, and the tenant when set.
const (
	HeaderTraceparent    = "traceparent"
	HeaderTracestate     = "tracestate"
	HeaderCEID           = "ce_id"
	HeaderCESource       = "ce_source"
	HeaderCEType         = "ce_type"
	HeaderCESpecVersion  = "ce_specversion"
	HeaderCETime         = "ce_time"
	HeaderCESubject      = "ce_subject"
	HeaderContentType    = "content-type"
	HeaderTenant         = "tenant"
	CloudEventsVersion   = "1.0"
	ContentTypeAvro      = "application/avro"
	headersPerRecordHint = 10
)

// claimed is one outbox row a relay is publishing.
type claimed struct {
	seq         int64
	id          string
	aggID       string
	version     int64
	typ, topic  string
	payload     []byte
	value       []byte // JSON; nil when payload is set
	tenant      *string
	source      string
	subject     *string
	at          time.Time
	traceparent *string
	tracestate  *string
	age         float64 // seconds between created_at and the claim
}

// record is the Kafka record of c with value v.
func (c *claimed) record(v []byte) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, headersPerRecordHint)
	add := func(k, v string) { h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	if c.traceparent != nil {
		add(HeaderTraceparent, *c.traceparent)
		if c.tracestate != nil {
			add(HeaderTracestate, *c.tracestate)
		}
	}
	add(HeaderCESpecVersion, CloudEventsVersion)
	add(HeaderCEID, c.id)
	add(HeaderCESource, c.source)
	add(HeaderCEType, c.typ)
	add(HeaderCETime, c.at.UTC().Format(time.RFC3339Nano))
	if c.subject != nil && *c.subject != "" {
		add(HeaderCESubject, *c.subject)
	}
	add(HeaderContentType, ContentTypeAvro)
	if c.tenant != nil {
		add(HeaderTenant, *c.tenant)
	}
	return &kgo.Record{Topic: c.topic, Key: []byte(c.aggID), Value: v, Headers: h}
}
