// Package bench measures projector against the ceiling of what Postgres can
// ingest (COPY) and against the hand-written consumers users write instead
// (one multi-row upsert per poll guarded by version; one transaction per
// event, plain franz-go or Watermill), on one generated stream and one
// Postgres. It backs `projector-bench`.
//
// The orchestrating process owns the broker (an embedded kfake cluster
// unless real brokers are given), the Schema Registry (srfake), the
// generated stream and the reference fold; every consumer under test runs
// in a child process of its own (the same binary, `projector-bench
// --worker`), so that its CPU time and peak RSS are its own and not the
// broker's.
package bench

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/projector-dev/projector/internal/demo"
)

// Skew of the aggregate each event belongs to.
const (
	SkewUniform = "uniform"
	// SkewZipf makes a few aggregates hot: many events of one aggregate
	// land in one batch and must collapse into one row write.
	SkewZipf = "zipf"
)

// GenOptions shape a benchmark stream: Events events over Aggregates
// accounts, versions in order per account (but for Reorder), no
// duplicates (but for Duplicate), gaps or poison.
type GenOptions struct {
	Events     int    `json:"events"`
	Aggregates int    `json:"aggregates"`
	Skew       string `json:"skew"`
	// CloseEvery closes every n-th account with its last event (0: never).
	CloseEvery int `json:"close_every"`
	// Reorder is the share of an account's events that change places
	// with its next one: the later version arrives first and waits (is
	// parked) until the earlier one fills its gap.
	Reorder float64 `json:"reorder"`
	// Duplicate is the share of events sent a second time, right after
	// the next event of their account: a stale copy, as an at-least-once
	// producer or outbox relay sends when it retries.
	Duplicate float64 `json:"duplicate,omitempty"`
	Seed      uint64  `json:"seed"`
}

// DefaultCloseEvery matches the demo stream: one account in 20 ends closed.
const DefaultCloseEvery = 20

// Generate returns o.Events events in produce order, and the copies
// o.Duplicate adds. Each event
// picks its account (uniformly, or Zipf-distributed with SkewZipf) and
// carries that account's next version, so every prefix of the stream (and
// of each partition) is a valid stream of its own. The first event of an
// account opens it; with CloseEvery the last event of every n-th account
// (with more than one event) closes it; the others deposit or withdraw.
func Generate(o GenOptions) ([]demo.Record, error) {
	if o.Events < 0 || o.Aggregates < 1 {
		return nil, fmt.Errorf("generate: %d events over %d aggregates", o.Events, o.Aggregates)
	}
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	pick := func() int { return rng.IntN(o.Aggregates) }
	switch o.Skew {
	case "", SkewUniform:
	case SkewZipf:
		// s = 1.1: the hottest account takes a few percent of all events,
		// the long tail has one or two each.
		z := rand.NewZipf(rng, 1.1, 1, uint64(o.Aggregates-1))
		pick = func() int { return int(z.Uint64()) }
	default:
		return nil, fmt.Errorf("generate: skew %q: want uniform or zipf", o.Skew)
	}
	picks := make([]int32, o.Events)
	counts := make([]int32, o.Aggregates)
	for i := range picks {
		a := pick()
		picks[i] = int32(a)
		counts[a]++
	}
	ids := make([]string, o.Aggregates)
	seen := make([]int32, o.Aggregates)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]demo.Record, o.Events)
	for i, a := range picks {
		if ids[a] == "" {
			ids[a] = fmt.Sprintf("acc-%07d", a)
		}
		seen[a]++
		v, n := seen[a], counts[a]
		ev := demo.Event{AccountID: ids[a], Version: int64(v), OccurredAt: base.Add(time.Duration(i) * time.Millisecond)}
		switch {
		case v == 1:
			ev.Type, ev.Owner = "AccountOpened", "owner "+strconv.Itoa(int(a))
		case v == n && o.CloseEvery > 0 && int(a)%o.CloseEvery == 0:
			ev.Type = "AccountClosed"
		case rng.IntN(3) == 0:
			ev.Type, ev.Amount = "Withdrawn", int64(1+rng.IntN(500))
		default:
			ev.Type, ev.Amount = "Deposited", int64(1+rng.IntN(1000))
		}
		out[i] = demo.Record{Key: ev.AccountID, Event: ev}
	}
	if o.Reorder > 0 {
		reorder(out, picks, o.Aggregates, o.Reorder, rng)
	}
	if o.Duplicate > 0 {
		out = duplicate(out, o.Duplicate, rng)
	}
	return out, nil
}

// duplicate sends a share of the events again, right after the next event
// of their account, which makes the copy stale. A copy of an account's last
// event is not sent: nothing follows it.
func duplicate(in []demo.Record, share float64, rng *rand.Rand) []demo.Record {
	out := make([]demo.Record, 0, len(in)+int(share*float64(len(in)))+1)
	pending := map[string]demo.Record{}
	for _, r := range in {
		out = append(out, r)
		if p, ok := pending[r.Key]; ok {
			out = append(out, p)
			delete(pending, r.Key)
		}
		if rng.Float64() < share {
			pending[r.Key] = r
		}
	}
	return out
}

// reorder swaps the places of a share of the events of each account with
// its next event's (an event swapped forward is not swapped again).
func reorder(out []demo.Record, picks []int32, aggregates int, share float64, rng *rand.Rand) {
	last := make([]int32, aggregates) // an account's latest place not yet swapped, plus one
	for i, a := range picks {
		if j := last[a] - 1; j >= 0 && rng.Float64() < share {
			out[i], out[j] = out[j], out[i]
			last[a] = 0
			continue
		}
		last[a] = int32(i) + 1
	}
}

// WriterSchema is the schema benchmark values are written with: the demo's
// v1 AccountEvent plus a padding string with a default, so the projection
// reads them with the demo's v1 reader schema (writer→reader resolution
// skips the padding) and values reach a realistic size.
const WriterSchema = `{
  "type": "record",
  "name": "AccountEvent",
  "namespace": "demo.accounts",
  "fields": [
    {"name": "account_id", "type": "string"},
    {"name": "version", "type": "long"},
    {"name": "type", "type": "string"},
    {"name": "owner", "type": ["null", "string"], "default": null},
    {"name": "amount", "type": "long", "default": 0},
    {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "padding", "type": "string", "default": ""}
  ]
}`

// filler is what padding is cut from.
var filler = func() string {
	b := make([]byte, 4096)
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
	for i := range b {
		b[i] = alphabet[(i*7+i/37)%len(alphabet)]
	}
	return string(b)
}()

// AppendValue appends the Confluent wire-format value of ev under WriterSchema
// (registered as schemaID), padded so that the whole value is about size
// bytes (never less than the unpadded event). It encodes by hand, which is
// exact about the size and fast enough for millions of values; a test
// checks it against the registry encoder (schemas.AppendWire).
func AppendValue(dst []byte, schemaID int, ev demo.Event, size int) []byte {
	start := len(dst)
	dst = appendUnpadded(dst, schemaID, ev)
	return appendString(dst, filler[:paddingLen(len(dst)-start, size)])
}

// paddingLen is the length of the padding string that brings a value whose
// other fields take n bytes (magic byte and schema id included) to about
// size bytes. Other encodings of the stream pad each event as much.
func paddingLen(n, size int) int {
	pad := size - n - 1 // 1: the padding's length prefix
	if pad > 63 {
		pad-- // a length of 64 or more takes two bytes
	}
	return max(0, min(pad, len(filler)))
}

// appendUnpadded appends the wire-format value of ev up to its padding.
func appendUnpadded(dst []byte, schemaID int, ev demo.Event) []byte {
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(schemaID))
	dst = appendString(dst, ev.AccountID)
	dst = appendLong(dst, ev.Version)
	dst = appendString(dst, ev.Type)
	if ev.Owner == "" {
		dst = appendLong(dst, 0) // union branch 0: null
	} else {
		dst = appendLong(dst, 1)
		dst = appendString(dst, ev.Owner)
	}
	dst = appendLong(dst, ev.Amount)
	return appendLong(dst, ev.OccurredAt.UnixMilli())
}

func appendLong(dst []byte, v int64) []byte {
	return binary.AppendUvarint(dst, uint64((v<<1)^(v>>63)))
}

func appendString(dst []byte, s string) []byte {
	dst = appendLong(dst, int64(len(s)))
	return append(dst, s...)
}
