package bench

import (
	"strconv"

	"github.com/projector-dev/projector/internal/avrojson"
	"github.com/projector-dev/projector/internal/demo"
)

// The Kafka Connect peer reads the stream as Kafka Connect's JsonConverter
// with schemas.enable=true does: every key and value is an envelope
// {"schema": ..., "payload": ...} that carries its Connect schema along.

// connectKeySchema is the key's Connect schema: a struct of the account
// id, which the sink's primary.key.mode=record_key makes the primary key.
const connectKeySchema = `{"type":"struct","name":"demo.accounts.AccountKey","optional":false,"fields":[` +
	`{"field":"account_id","type":"string","optional":false}]}`

// connectValueSchema is WriterSchema's Connect equivalent: the same fields
// in the same order, occurred_at as Connect's Timestamp logical type
// (milliseconds since the epoch), owner optional.
const connectValueSchema = `{"type":"struct","name":"demo.accounts.AccountEvent","optional":false,"fields":[` +
	`{"field":"account_id","type":"string","optional":false},` +
	`{"field":"version","type":"int64","optional":false},` +
	`{"field":"type","type":"string","optional":false},` +
	`{"field":"owner","type":"string","optional":true},` +
	`{"field":"amount","type":"int64","optional":false},` +
	`{"field":"occurred_at","type":"int64","optional":false,"name":"org.apache.kafka.connect.data.Timestamp","version":1},` +
	`{"field":"padding","type":"string","optional":false}]}`

// appendConnectKey appends the JsonConverter envelope of an account's key.
func appendConnectKey(dst []byte, accountID string) []byte {
	dst = append(dst, `{"schema":`+connectKeySchema+`,"payload":{"account_id":`...)
	dst = avrojson.AppendString(dst, accountID)
	return append(dst, "}}"...)
}

// appendConnectValue appends the JsonConverter envelope of ev, with the
// padding AppendValue gives the event's Avro value of about size bytes, so
// that both topics carry the same events with the same payload. scratch is
// reused to measure the Avro value; the grown scratch is returned too.
func appendConnectValue(dst, scratch []byte, ev demo.Event, size int) ([]byte, []byte) {
	scratch = appendUnpadded(scratch[:0], 0, ev)
	pad := paddingLen(len(scratch), size)
	dst = append(dst, `{"schema":`+connectValueSchema+`,"payload":{"account_id":`...)
	dst = avrojson.AppendString(dst, ev.AccountID)
	dst = append(dst, `,"version":`...)
	dst = strconv.AppendInt(dst, ev.Version, 10)
	dst = append(dst, `,"type":`...)
	dst = avrojson.AppendString(dst, ev.Type)
	dst = append(dst, `,"owner":`...)
	if ev.Owner == "" {
		dst = append(dst, "null"...)
	} else {
		dst = avrojson.AppendString(dst, ev.Owner)
	}
	dst = append(dst, `,"amount":`...)
	dst = strconv.AppendInt(dst, ev.Amount, 10)
	dst = append(dst, `,"occurred_at":`...)
	dst = strconv.AppendInt(dst, ev.OccurredAt.UnixMilli(), 10)
	dst = append(dst, `,"padding":`...)
	dst = avrojson.AppendString(dst, filler[:pad])
	return append(dst, "}}"...), scratch
}
