package deadletters_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/sinks"
)

// TestDeadLetterOfAnyBytesIsStored writes dead letters whose record
// carries what Postgres text and jsonb cannot hold (a NUL byte and invalid
// UTF-8 in the key, the value, a header's key and the error message, and a
// 100 KB key): each is stored, its key and value byte for byte.
func TestDeadLetterOfAnyBytesIsStored(t *testing.T) {
	pool := dlDB(t)
	ctx := t.Context()
	bad := "a\x00b\xff\xfec"
	big := []byte(strings.Repeat("k", 100_000))
	dls := []sinks.DeadLetter{
		{Offset: 1, RecordKey: []byte(bad), Value: []byte(bad), Headers: []sinks.Header{{Key: bad, Value: []byte(bad)}, {Key: "ok", Value: []byte("v")}},
			Err: "record key " + bad + " is bad", Class: sinks.ClassInvalidKey},
		{Offset: 2, RecordKey: big, Value: big, Err: string(big), Class: sinks.ClassRefused},
	}
	b := &pgx.Batch{}
	deadletters.QueueWrite(b, "id", "p", sinks.TP{Topic: "t", Partition: 0}, dls, "")
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatalf("write dead letters: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT "offset", record_key, value, error, jsonb_array_length(headers) FROM projector_dead_letters ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			off        int64
			key, value []byte
			msg        string
			headers    int
		)
		if err := rows.Scan(&off, &key, &value, &msg, &headers); err != nil {
			t.Fatal(err)
		}
		want := dls[off-1]
		if !bytes.Equal(key, want.RecordKey) || !bytes.Equal(value, want.Value) || headers != len(want.Headers) {
			t.Errorf("offset %d: key %d bytes, value %d bytes, %d headers; want them byte for byte (%d, %d, %d)",
				off, len(key), len(value), headers, len(want.RecordKey), len(want.Value), len(want.Headers))
		}
		if msg != deadletters.Text(want.Err) {
			t.Errorf("offset %d: error %q, want %q", off, msg, deadletters.Text(want.Err))
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(dls) {
		t.Errorf("%d dead letters stored, want %d", n, len(dls))
	}
}
