package postgres_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/sinks"
)

const lengthsYAML = `projections:
  - name: lengths
    topic: lengths.events
    table: lengths
    key: id
    mode: snapshot
    columns:
      id:    {type: varchar(8), primary_key: true}
      code:  {type: varchar(5)}
      flag:  {type: char(3)}
      bits:  {type: bit(4)}
      vbits: {type: varbit(4)}
      tags:  {type: "varchar(3)[]"}
`

// A value longer than its column's length (varchar(n), char(n), bit(n),
// varbit(n), a key of varchar(n), an array element) is refused, naming
// the column, never stored cut short; the rows that fit are written once
// the refused ones are left out, as a worker does.
func TestValuesTooLongAreRefusedNotTruncated(t *testing.T) {
	e := newEnv(t, parseOne(t, lengthsYAML))
	c := e.claim(0)
	row := func(id, code, flag, bits, vbits, tags string) sinks.RowWrite {
		return sinks.RowWrite{Key: id, Version: 1, Row: projection.Row{"id": id, "code": code, "flag": flag, "bits": bits, "vbits": vbits, "tags": tags}}
	}
	rows := []sinks.RowWrite{
		row("ok-1", "abcde", "xyz", "1010", "101", "{abc,de}"),
		row("ok-2", "ab", "x  ", "0000", "", "{}"),
		row("code-1", "abcdef", "xyz", "1010", "1", "{a}"),
		row("flag-1", "abc", "wxyz", "1010", "1", "{a}"),
		row("bits-1", "abc", "xyz", "10101", "1", "{a}"),
		row("bits-2", "abc", "xyz", "101", "1", "{a}"),
		row("vbits-1", "abc", "xyz", "1010", "10101", "{a}"),
		row("tags-1", "abc", "xyz", "1010", "1", "{abcd}"),
		row("key-too-long", "abc", "xyz", "1010", "1", "{a}"),
	}
	wantCol := map[string]string{"code-1": "code", "flag-1": "flag", "bits-1": "bits", "bits-2": "bits", "vbits-1": "vbits", "tags-1": "tags", "key-too-long": "id"}
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.Key)
	}
	rejected := map[string]string{}
	err := e.sink.CommitBatch(e.ctx, c, 1, sinks.Keys{All: keys}, func(sinks.State) (sinks.Changes, error) {
		var ch sinks.Changes
		for _, r := range rows {
			if rejected[r.Key] == "" {
				ch.Upserts = append(ch.Upserts, r)
			}
		}
		return ch, nil
	})
	var rej *sinks.RejectedRows
	if !errors.As(err, &rej) {
		t.Fatalf("commit = %v, want the rows too long for their columns refused", err)
	}
	if got, want := slices.Sorted(maps.Keys(rej.Keys)), slices.Sorted(maps.Keys(wantCol)); !slices.Equal(got, want) {
		t.Errorf("refused %q, want %q", got, want)
	}
	for k, col := range wantCol {
		if msg := rej.Keys[k]; !strings.HasPrefix(msg, "column "+col+" (") {
			t.Errorf("refusal of %s = %q, want it to name column %s", k, msg, col)
		}
	}
	maps.Copy(rejected, rej.Keys)
	e.wantOffset(0)
	err = e.sink.CommitBatch(e.ctx, c, 1, sinks.Keys{All: keys}, func(sinks.State) (sinks.Changes, error) {
		var ch sinks.Changes
		for _, r := range rows {
			if rejected[r.Key] == "" {
				ch.Upserts = append(ch.Upserts, r)
			}
		}
		return ch, nil
	})
	if err != nil {
		t.Fatalf("commit without the refused rows: %v", err)
	}
	e.wantOffset(1)
	got, err := e.db.Pool.Query(e.ctx, `SELECT id || '|' || code || '|' || flag::text || '|' || bits::text || '|' || vbits::text || '|' || tags::text FROM lengths ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	for got.Next() {
		var s string
		if err := got.Scan(&s); err != nil {
			t.Fatal(err)
		}
		table = append(table, s)
	}
	if err := got.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"ok-1|abcde|xyz|1010|101|{abc,de}", "ok-2|ab|x|0000||{}"}
	if !slices.Equal(table, want) {
		t.Errorf("table = %q, want %q", table, want)
	}
}
