package projection_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projection"
)

const foldYAML = `projections:
  - name: acc
    topic: acc.events
    table: acc
    key: id
    mode: fold
    type_field: type
    columns:
      id:        {type: text, primary_key: true}
      owner:     {type: text}
      balance:   {type: bigint, default: 10}
      score:     {type: double precision}
      active:    {type: boolean, default: false}
      status:    {type: text}
      level:     {type: integer}
      opened_at: {type: timestamptz}
    events:
      Opened:    {set: {owner: owner, opened_at: occurred_at, status: {literal: open}, active: true, level: 3, score: 1.5}}
      Deposited: {add: {balance: amount, score: bonus}}
      Withdrawn: {add: {balance: "-amount"}}
      Penalised: {add: {score: " - fine"}}
      Renamed:   {set: {owner: new_owner}}
      Cleared:   {set: {owner: null, status: {literal: "123"}}}
      Leveled:   {set: {level: lvl}}
      Closed:    {delete: true}
`

func mustParse(t *testing.T, src string) *projection.Projection {
	t.Helper()
	ps, err := projection.Parse([]byte(src), ".")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(ps) != 1 {
		t.Fatalf("got %d projections, want 1", len(ps))
	}
	return ps[0]
}

func copyRow(r projection.Row) projection.Row {
	if r == nil {
		return nil
	}
	c := make(projection.Row, len(r))
	for k, v := range r {
		c[k] = v
	}
	return c
}

// fold runs p.Apply and checks it leaves the input state alone, and that
// the event built with NewEvent, as the engine decodes it, folds the same.
func fold(t *testing.T, p *projection.Projection, state projection.Row, ev projection.Event) (projection.Row, error) {
	t.Helper()
	before := copyRow(state)
	row, err := p.Apply(state, ev)
	if !reflect.DeepEqual(state, before) {
		t.Errorf("fold of %s changed its input state: %v, was %v", ev.Type, state, before)
	}
	if ev.Fields != nil && !p.ReadsFieldsMap() {
		names := append([]string{}, slices.Sorted(maps.Keys(ev.Fields))...) // never nil: a record, not a tombstone
		values := make([]any, len(names))
		for i, n := range names {
			values[i] = ev.Fields[n]
		}
		vrow, verr := p.Apply(state, projection.NewEvent(ev.Key, ev.Version, ev.Type, names, values))
		if !reflect.DeepEqual(vrow, row) || fmt.Sprint(verr) != fmt.Sprint(err) {
			t.Errorf("fold of %s from values: row %v, error %v; from the map: row %v, error %v", ev.Type, vrow, verr, row, err)
		}
	}
	return row, err
}

func wantRow(t *testing.T, got, want projection.Row) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("row =\n %#v\nwant\n %#v", got, want)
	}
}

func TestFoldSet(t *testing.T) {
	p := mustParse(t, foldYAML)
	at := time.Date(2026, 3, 4, 7, 6, 7, 123456789, time.FixedZone("CET", 3600))
	row, err := fold(t, p, nil, projection.Event{Key: "a1", Version: 1, Type: "Opened", Fields: map[string]any{
		"owner": "ann", "occurred_at": at, "status": "ignored: literal wins",
	}})
	if err != nil {
		t.Fatal(err)
	}
	opened := projection.Row{
		"id": "a1", "owner": "ann", "balance": int64(10), "score": 1.5, "active": true,
		"status": "open", "level": int64(3), "opened_at": "2026-03-04T06:06:07.123456789Z",
	}
	wantRow(t, row, opened)

	// Set from a field replaces only that column; the key comes from the event.
	renamed, err := fold(t, p, opened, projection.Event{Key: "a1", Version: 2, Type: "Renamed", Fields: map[string]any{"new_owner": "bob"}})
	if err != nil {
		t.Fatal(err)
	}
	want := copyRow(opened)
	want["owner"] = "bob"
	wantRow(t, renamed, want)

	// A null literal clears the column; a quoted number stays text.
	cleared, err := fold(t, p, opened, projection.Event{Key: "a1", Version: 2, Type: "Cleared", Fields: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	want = copyRow(opened)
	want["owner"], want["status"] = nil, "123"
	wantRow(t, cleared, want)

	// Set converts the field to the column's kind.
	leveled, err := fold(t, p, opened, projection.Event{Key: "a1", Version: 2, Type: "Leveled", Fields: map[string]any{"lvl": int32(9)}})
	if err != nil {
		t.Fatal(err)
	}
	want = copyRow(opened)
	want["level"] = int64(9)
	wantRow(t, leveled, want)
}

func TestFoldNewRowTakesDefaults(t *testing.T) {
	p := mustParse(t, foldYAML)
	row, err := fold(t, p, nil, projection.Event{Key: "a1", Version: 1, Type: "Renamed", Fields: map[string]any{"new_owner": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	wantRow(t, row, projection.Row{
		"id": "a1", "owner": "x", "balance": int64(10), "score": nil, "active": false,
		"status": nil, "level": nil, "opened_at": nil,
	})
}

func TestFoldAdd(t *testing.T) {
	p := mustParse(t, foldYAML)
	state := projection.Row{"id": "a1", "owner": "ann", "balance": int64(10), "score": 1.5, "active": true}
	cases := []struct {
		name   string
		state  projection.Row
		typ    string
		fields map[string]any
		col    string
		want   any
	}{
		{"deposit long", state, "Deposited", map[string]any{"amount": int64(5), "bonus": 0.25}, "balance", int64(15)},
		{"deposit int", state, "Deposited", map[string]any{"amount": int32(7), "bonus": 0.25}, "balance", int64(17)},
		{"deposit float field", state, "Deposited", map[string]any{"amount": int64(5), "bonus": 0.25}, "score", 1.75},
		{"deposit int into float", state, "Deposited", map[string]any{"amount": int64(0), "bonus": int64(2)}, "score", 3.5},
		{"withdraw", state, "Withdrawn", map[string]any{"amount": int64(25)}, "balance", int64(-15)},
		{"subtract float with spaces", state, "Penalised", map[string]any{"fine": 0.5}, "score", 1.0},
		{"null counts as zero", projection.Row{"id": "a1", "balance": nil}, "Withdrawn", map[string]any{"amount": int64(4)}, "balance", int64(-4)},
		{"new row starts at the default", nil, "Deposited", map[string]any{"amount": int64(5), "bonus": 1.0}, "balance", int64(15)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			row, err := fold(t, p, tc.state, projection.Event{Key: "a1", Version: 2, Type: tc.typ, Fields: tc.fields})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(row[tc.col], tc.want) {
				t.Errorf("%s = %#v, want %#v", tc.col, row[tc.col], tc.want)
			}
			if row["id"] != "a1" {
				t.Errorf("key column = %v, want a1", row["id"])
			}
		})
	}
}

const decimalFoldYAML = `
projections:
  - name: ledger
    topic: ledger
    table: ledger
    key: id
    mode: fold
    type_field: type
    columns:
      id:      {type: text, primary_key: true}
      total:   {type: numeric, default: 0}
      cents:   {type: "numeric(12,2)"}
    events:
      Booked:
        add: {total: amount, cents: amount}
      Reversed:
        add: {total: -amount, cents: -amount}
`

// TestFoldAddDecimal: add to a numeric column is exact, rounded as a
// numeric(p,s) column rounds, and a current value that is no number fails
// the event without changing the row.
func TestFoldAddDecimal(t *testing.T) {
	p := mustParse(t, decimalFoldYAML)
	ev := func(typ string, amount any) projection.Event {
		return projection.Event{Key: "a", Version: 2, Type: typ, Fields: map[string]any{"amount": amount}}
	}
	row, err := fold(t, p, nil, ev("Booked", big.NewRat(1, 10)))
	if err != nil {
		t.Fatal(err)
	}
	row, err = fold(t, p, row, ev("Booked", big.NewRat(2, 10)))
	if err != nil {
		t.Fatal(err)
	}
	row, err = fold(t, p, row, ev("Reversed", big.NewRat(-5, 1000))) // "-" of a negative amount
	if err != nil {
		t.Fatal(err)
	}
	if row["total"] != "0.305" || row["cents"] != "0.31" {
		t.Errorf("total, cents = %v, %v; want 0.305, 0.31", row["total"], row["cents"])
	}
	row, err = fold(t, p, projection.Row{"id": "a", "total": "12.50", "cents": nil}, ev("Booked", int64(3)))
	if err != nil || row["total"] != "15.5" || row["cents"] != "3.00" {
		t.Errorf("from a value read back: %v, %v; want total 15.5, cents 3.00", row, err)
	}
	bad := projection.Row{"id": "a", "total": "NaN", "cents": "1.00"}
	if _, err := fold(t, p, bad, ev("Booked", int64(1))); err == nil || !projection.IsTerminal(err) || !strings.Contains(err.Error(), "total") {
		t.Errorf("add to NaN: %v, want a terminal error naming total", err)
	}
	if _, err := projection.Parse([]byte(strings.Replace(decimalFoldYAML, "total:   {type: numeric, default: 0}", "total:   {type: jsonb}", 1)), "."); err == nil ||
		!strings.Contains(err.Error(), "events.Booked.add.total") || !strings.Contains(err.Error(), "jsonb") {
		t.Errorf("add to jsonb: %v, want refused at load naming events.Booked.add.total", err)
	}
}

func TestFoldDeletes(t *testing.T) {
	p := mustParse(t, foldYAML)
	state := projection.Row{"id": "a1", "owner": "ann", "balance": int64(10)}
	row, err := fold(t, p, state, projection.Event{Key: "a1", Version: 3, Type: "Closed", Fields: map[string]any{}})
	if err != nil || row != nil {
		t.Errorf("delete verb: row %v, err %v; want nil, nil", row, err)
	}
	if !p.DeleteTypes["Closed"] {
		t.Errorf("Closed missing from DeleteTypes %v", p.DeleteTypes)
	}
	// A tombstone deletes whatever its type.
	row, err = fold(t, p, state, projection.Event{Key: "a1", Version: 3, Type: "Deposited", Fields: nil})
	if err != nil || row != nil {
		t.Errorf("tombstone: row %v, err %v; want nil, nil", row, err)
	}
}

func TestFoldUnknownTypeKeepsRow(t *testing.T) {
	p := mustParse(t, foldYAML)
	state := projection.Row{
		"id": "a1", "owner": "ann", "balance": int64(42), "score": 2.5, "active": true,
		"status": "open", "level": int64(1), "opened_at": "2026-01-01T00:00:00Z",
	}
	row, err := fold(t, p, state, projection.Event{Key: "a1", Version: 7, Type: "SomethingElse", Fields: map[string]any{"balance": int64(1)}})
	if err != nil {
		t.Fatal(err)
	}
	wantRow(t, row, state)
	if row == nil {
		t.Fatal("unknown type deleted the row")
	}
	// The result is a copy: changing it leaves the input alone.
	row["owner"] = "changed"
	if state["owner"] != "ann" {
		t.Error("the returned row aliases the input state")
	}
}

func TestFoldErrorsAreTerminal(t *testing.T) {
	p := mustParse(t, foldYAML)
	state := projection.Row{"id": "a1", "balance": int64(10), "score": 1.0}
	cases := []struct {
		name   string
		typ    string
		fields map[string]any
		want   []string
	}{
		{"add from a missing field", "Withdrawn", map[string]any{}, []string{"Withdrawn", "balance", `"amount"`}},
		{"add from a null field", "Deposited", map[string]any{"amount": nil, "bonus": 1.0}, []string{"Deposited", "balance", `"amount"`}},
		{"add a value of the wrong kind", "Deposited", map[string]any{"amount": "lots", "bonus": 1.0}, []string{"amount", "column balance"}},
		{"set from a missing field", "Renamed", map[string]any{}, []string{"Renamed", "owner", `"new_owner"`}},
		{"set a value of the wrong kind", "Leveled", map[string]any{"lvl": "high"}, []string{"lvl", "column level"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			row, err := fold(t, p, state, projection.Event{Key: "a1", Version: 2, Type: tc.typ, Fields: tc.fields})
			if err == nil {
				t.Fatalf("no error; row %v", row)
			}
			if !projection.IsTerminal(err) {
				t.Errorf("error %v is not terminal", err)
			}
			if row != nil {
				t.Errorf("row %v returned with the error", row)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestTerminal(t *testing.T) {
	if projection.Terminal(nil) != nil {
		t.Error("Terminal(nil) != nil")
	}
	base := errTest("boom")
	err := projection.Terminal(base)
	if !projection.IsTerminal(err) || err.Error() != "boom" {
		t.Errorf("Terminal(boom) = %v, terminal %v", err, projection.IsTerminal(err))
	}
	if projection.IsTerminal(base) {
		t.Error("a plain error is terminal")
	}
	wrapped := wrapErr{err}
	if !projection.IsTerminal(wrapped) {
		t.Error("a wrapped terminal error is not terminal")
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

type wrapErr struct{ err error }

func (w wrapErr) Error() string { return "wrapped: " + w.err.Error() }
func (w wrapErr) Unwrap() error { return w.err }

func TestFoldDemo(t *testing.T) {
	ps, err := projection.Parse(demo.Projections, ".")
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var row projection.Row
	steps := []projection.Event{
		{Type: "AccountOpened", Fields: map[string]any{"owner": "ann", "occurred_at": at}},
		{Type: "Deposited", Fields: map[string]any{"amount": int64(100)}},
		{Type: "Withdrawn", Fields: map[string]any{"amount": int64(30)}},
	}
	for i, ev := range steps {
		ev.Key, ev.Version = "acc-1", int64(i+1)
		if row, err = p.Apply(row, ev); err != nil {
			t.Fatalf("v%d: %v", i+1, err)
		}
	}
	wantRow(t, row, projection.Row{"account_id": "acc-1", "owner": "ann", "balance": int64(70), "opened_at": "2026-01-01T00:00:00Z"})
	if row, err = p.Apply(row, projection.Event{Key: "acc-1", Version: 4, Type: "AccountClosed", Fields: map[string]any{}}); err != nil || row != nil {
		t.Errorf("AccountClosed: row %v, err %v; want a delete", row, err)
	}
}

const snapshotYAML = `projections:
  - name: snap
    topic: snap.events
    table: snap
    key: id
    mode: snapshot
    type_field: type
    on_gap: apply
    delete_on: [Removed, Purged]
    columns:
      id:        {type: text, primary_key: true}
      full_name: {type: text, field: name}
      total:     {type: bigint, default: 5}
      ok:        {type: boolean}
      data:      {type: bytea}
`

func TestSnapshotFold(t *testing.T) {
	p := mustParse(t, snapshotYAML)
	if p.Mode != projection.ModeSnapshot || p.OnGap != projection.GapApply {
		t.Fatalf("mode/on_gap = %s/%s", p.Mode, p.OnGap)
	}
	old := projection.Row{"id": "k", "full_name": "Old", "total": int64(99), "ok": false, "data": `\x00`}
	row, err := fold(t, p, old, projection.Event{Key: "k", Version: 3, Type: "Updated", Fields: map[string]any{
		"id": "not used: the key comes from the event", "name": "Bo", "full_name": "not used: renamed",
		"total": int32(7), "ok": true, "data": []byte{0xde, 0xad}, "extra": "ignored",
	}})
	if err != nil {
		t.Fatal(err)
	}
	wantRow(t, row, projection.Row{"id": "k", "full_name": "Bo", "total": int64(7), "ok": true, "data": `\xdead`})

	// The whole row is replaced: a missing field is NULL, not the old
	// value (and not the default).
	row, err = fold(t, p, old, projection.Event{Key: "k", Version: 4, Type: "Updated", Fields: map[string]any{"name": "Cy"}})
	if err != nil {
		t.Fatal(err)
	}
	wantRow(t, row, projection.Row{"id": "k", "full_name": "Cy", "total": nil, "ok": nil, "data": nil})

	for _, typ := range []string{"Removed", "Purged"} {
		row, err = fold(t, p, old, projection.Event{Key: "k", Version: 5, Type: typ, Fields: map[string]any{"name": "x"}})
		if err != nil || row != nil {
			t.Errorf("%s: row %v, err %v; want a delete", typ, row, err)
		}
	}
	row, err = fold(t, p, old, projection.Event{Key: "k", Version: 5, Type: "Updated", Fields: nil})
	if err != nil || row != nil {
		t.Errorf("tombstone: row %v, err %v; want a delete", row, err)
	}

	_, err = fold(t, p, old, projection.Event{Key: "k", Version: 5, Type: "Updated", Fields: map[string]any{"name": "x", "total": "many"}})
	if err == nil || !projection.IsTerminal(err) || !strings.Contains(err.Error(), "total") {
		t.Errorf("wrong kind: err %v, want a terminal error naming total", err)
	}
}

func TestConvertRoundTrip(t *testing.T) {
	nan := math.NaN()
	at := time.Date(2026, 5, 6, 9, 8, 7, 654321000, time.FixedZone("X", -5*3600))
	cases := []struct {
		typ  string
		in   any
		conv any
		text string
	}{
		{"bigint", int64(-42), int64(-42), "-42"},
		{"bigint", int32(7), int64(7), "7"},
		{"bigint", 7, int64(7), "7"},
		{"bigint", float64(3), int64(3), "3"},
		{"bigint", float32(-2), int64(-2), "-2"},
		{"bigint", "12", int64(12), "12"},
		{"bigint", int64(math.MaxInt64), int64(math.MaxInt64), "9223372036854775807"},
		{"integer", int32(-5), int64(-5), "-5"},
		{"smallint", int64(3), int64(3), "3"},
		{"double precision", 1.25, 1.25, "1.25"},
		{"double precision", float32(0.5), 0.5, "0.5"},
		{"double precision", int64(2), 2.0, "2"},
		{"double precision", int32(-3), -3.0, "-3"},
		{"double precision", 1e300, 1e300, "1e+300"},
		{"double precision", math.Inf(1), math.Inf(1), "Infinity"},
		{"double precision", math.Inf(-1), math.Inf(-1), "-Infinity"},
		{"double precision", nan, nan, "NaN"},
		{"real", 0.1, 0.1, "0.1"},
		{"boolean", true, true, "true"},
		{"boolean", false, false, "false"},
		{"bool", true, true, "true"},
		{"text", "héllo\nworld", "héllo\nworld", "héllo\nworld"},
		{"text", "", "", ""},
		{"text", int64(5), "5", "5"},
		{"text", 2.5, "2.5", "2.5"},
		{"text", true, "true", "true"},
		{"text", []byte("raw"), "raw", "raw"},
		{"timestamptz", at, "2026-05-06T14:08:07.654321Z", "2026-05-06T14:08:07.654321Z"},
		{"timestamptz", "2026-05-06 14:08:07+00", "2026-05-06 14:08:07+00", "2026-05-06 14:08:07+00"},
		{"bytea", []byte{0x00, 0x01, 0xab, 0xff}, `\x0001abff`, `\x0001abff`},
		{"bytea", []byte{}, `\x`, `\x`},
		{"jsonb", map[string]any{"a": 1}, `{"a":1}`, `{"a":1}`},
		// The documented mapping (docs/types.md) beyond scalars.
		{"text[]", []any{"a", "b c", nil, "", `q"u\o`}, `{"a","b c",NULL,"","q\"u\\o"}`, `{"a","b c",NULL,"","q\"u\\o"}`},
		{"text[]", []any{}, `{}`, `{}`},
		{"bigint[]", []any{int64(1), int32(-2), nil}, `{"1","-2",NULL}`, `{"1","-2",NULL}`},
		{"integer[]", []any{[]any{1, 2}, []any{3, 4}}, `{{"1","2"},{"3","4"}}`, `{{"1","2"},{"3","4"}}`},
		{"bytea[]", []any{[]byte{0xab}}, `{"\\xab"}`, `{"\\xab"}`},
		{"timestamp with time zone[]", []any{at}, `{"2026-05-06T14:08:07.654321Z"}`, `{"2026-05-06T14:08:07.654321Z"}`},
		{"jsonb", []any{"a", int64(1), nil, []byte{1}, big.NewRat(-5, 4)}, `["a",1,null,"AQ==",-1.25]`, `["a",1,null,"AQ==",-1.25]`},
		{"jsonb", `{"already": "json"}`, `{"already": "json"}`, `{"already": "json"}`},
		{"jsonb", json.RawMessage(`"branch"`), `"branch"`, `"branch"`},
		{"numeric", big.NewRat(-123456789, 1000000), "-123.456789", "-123.456789"},
		{"numeric(10,2)", big.NewRat(12345, 1000), "12.35", "12.35"},
		{"numeric(10,2)", big.NewRat(-12345, 1000), "-12.35", "-12.35"},
		{"text", big.NewRat(1, 8), "0.125", "0.125"},
		{"date", time.Date(1969, 7, 20, 0, 0, 0, 0, time.UTC), "1969-07-20", "1969-07-20"},
		{"date", time.Date(0, 3, 1, 0, 0, 0, 0, time.UTC), "0001-03-01 BC", "0001-03-01 BC"},
		{"time without time zone", 13*time.Hour + 14*time.Minute + 15*time.Second + 678*time.Millisecond, "13:14:15.678000", "13:14:15.678000"},
		{"time without time zone", 5 * time.Second, "00:00:05", "00:00:05"},
		{"timestamp without time zone", at, "2026-05-06T09:08:07.654321", "2026-05-06T09:08:07.654321"},
		{"timestamp without time zone", at.UTC(), "2026-05-06T14:08:07.654321Z", "2026-05-06T14:08:07.654321Z"},
		{"bytea", [2]byte{0xca, 0xfe}, `\xcafe`, `\xcafe`},
		// A union of several branches, as JSON, into columns that are not
		// JSON: the branch's value.
		{"text", json.RawMessage(`"a\"b"`), `a"b`, `a"b`},
		{"text", json.RawMessage(`12.50`), `12.50`, `12.50`},
		{"bigint", json.RawMessage(`-42`), int64(-42), "-42"},
		{"double precision", json.RawMessage(`2.5`), 2.5, "2.5"},
		{"boolean", json.RawMessage(`true`), true, "true"},
		{"text", json.RawMessage(`{"a":1}`), `{"a":1}`, `{"a":1}`},
	}
	same := func(a, b any) bool {
		if fa, ok := a.(float64); ok && math.IsNaN(fa) {
			fb, ok := b.(float64)
			return ok && math.IsNaN(fb)
		}
		return reflect.DeepEqual(a, b)
	}
	for _, tc := range cases {
		c := projection.Column{Name: "col", Type: tc.typ}
		conv, err := c.Convert(tc.in)
		if err != nil {
			t.Errorf("%s: Convert(%T %v): %v", tc.typ, tc.in, tc.in, err)
			continue
		}
		if !same(conv, tc.conv) {
			t.Errorf("%s: Convert(%T %v) = %T %#v, want %T %#v", tc.typ, tc.in, tc.in, conv, conv, tc.conv, tc.conv)
			continue
		}
		text, err := c.EncodeText(conv)
		if err != nil || text == nil {
			t.Errorf("%s: EncodeText(%#v) = %v, %v", tc.typ, conv, text, err)
			continue
		}
		if *text != tc.text {
			t.Errorf("%s: EncodeText(%#v) = %q, want %q", tc.typ, conv, *text, tc.text)
		}
		// EncodeText converts what Convert would.
		if direct, err := c.EncodeText(tc.in); err != nil || direct == nil || *direct != tc.text {
			t.Errorf("%s: EncodeText(%T %v) = %v, %v; want %q", tc.typ, tc.in, tc.in, direct, err, tc.text)
		}
		back, err := c.DecodeText(text)
		if err != nil {
			t.Errorf("%s: DecodeText(%q): %v", tc.typ, *text, err)
			continue
		}
		if !same(back, conv) {
			t.Errorf("%s: DecodeText(%q) = %T %#v, want %T %#v", tc.typ, *text, back, back, conv, conv)
		}
	}
}

func TestConvertNull(t *testing.T) {
	for _, typ := range []string{"bigint", "double precision", "boolean", "text", "timestamptz", "bytea"} {
		c := projection.Column{Name: "col", Type: typ}
		if v, err := c.Convert(nil); v != nil || err != nil {
			t.Errorf("%s: Convert(nil) = %v, %v", typ, v, err)
		}
		if s, err := c.EncodeText(nil); s != nil || err != nil {
			t.Errorf("%s: EncodeText(nil) = %v, %v; want NULL", typ, s, err)
		}
		if v, err := c.DecodeText(nil); v != nil || err != nil {
			t.Errorf("%s: DecodeText(NULL) = %v, %v", typ, v, err)
		}
	}
}

func TestDecodePostgresText(t *testing.T) {
	// What Postgres prints for a column cast to text.
	cases := []struct {
		typ, text string
		want      any
	}{
		{"boolean", "t", true},
		{"boolean", "f", false},
		{"boolean", "true", true},
		{"boolean", "false", false},
		{"bigint", "-9223372036854775808", int64(math.MinInt64)},
		{"integer", "0", int64(0)},
		{"double precision", "1e+100", 1e100},
		{"double precision", "-0.5", -0.5},
		{"real", "Infinity", math.Inf(1)},
		{"timestamptz", "2026-05-06 14:08:07.654321+00", "2026-05-06 14:08:07.654321+00"},
	}
	for _, tc := range cases {
		c := projection.Column{Name: "col", Type: tc.typ}
		s := tc.text
		got, err := c.DecodeText(&s)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: DecodeText(%q) = %#v, %v; want %#v", tc.typ, tc.text, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ typ, text string }{{"bigint", "1.5"}, {"integer", "abc"}, {"double precision", "x"}} {
		c := projection.Column{Name: "amount", Type: tc.typ}
		s := tc.text
		if _, err := c.DecodeText(&s); err == nil || !strings.Contains(err.Error(), "column amount") {
			t.Errorf("%s: DecodeText(%q) error %v, want one naming column amount", tc.typ, tc.text, err)
		}
	}
}

func TestConvertErrorsNameTheColumn(t *testing.T) {
	cases := []struct {
		typ string
		in  any
	}{
		{"bigint", "abc"},
		{"bigint", 1.5},
		{"bigint", true},
		{"bigint", float64(1 << 63)},
		{"bigint", []byte("1")},
		{"integer", float32(0.25)},
		{"double precision", "1.5"},
		{"double precision", true},
		{"boolean", "true"},
		{"boolean", int64(1)},
		{"text", func() {}},
	}
	for _, tc := range cases {
		c := projection.Column{Name: "amount", Type: tc.typ}
		v, err := c.Convert(tc.in)
		if err == nil {
			t.Errorf("%s: Convert(%T %v) = %#v, want an error", tc.typ, tc.in, tc.in, v)
			continue
		}
		if !strings.Contains(err.Error(), "column amount") || !strings.Contains(err.Error(), tc.typ) {
			t.Errorf("%s: Convert(%T) error %q does not name the column and its type", tc.typ, tc.in, err)
		}
		// EncodeText trusts Row value types (string, int64, float64,
		// bool) and converts the others, failing like Convert.
		switch tc.in.(type) {
		case string, int64, float64, bool:
		default:
			if _, err := c.EncodeText(tc.in); err == nil || !strings.Contains(err.Error(), "column amount") {
				t.Errorf("%s: EncodeText(%T) error %v, want one naming the column", tc.typ, tc.in, err)
			}
		}
	}
}

func TestColumnKind(t *testing.T) {
	cases := map[string]projection.Kind{
		"bigint": projection.KindInt, "integer": projection.KindInt, "smallint": projection.KindInt, "int8": projection.KindInt,
		"double precision": projection.KindFloat, "real": projection.KindFloat, "float8": projection.KindFloat,
		"boolean": projection.KindBool, "bool": projection.KindBool,
		"text": projection.KindText, "timestamptz": projection.KindText, "bytea": projection.KindText, "numeric(10,2)": projection.KindText,
	}
	for typ, want := range cases {
		if got := (projection.Column{Name: "c", Type: typ}).Kind(); got != want {
			t.Errorf("Kind(%s) = %v, want %v", typ, got, want)
		}
	}
}

func TestFoldReadsRow(t *testing.T) {
	p := mustParse(t, snapshotYAML)
	if p.FoldReadsRow() {
		t.Error("a declarative snapshot projection reads rows")
	}
	snapshot := p.Compiled()
	p.Fold = func(r projection.Row, ev projection.Event) (projection.Row, error) { return snapshot(r, ev) }
	if !p.FoldReadsRow() {
		t.Error("a Go fold on a snapshot projection is taken not to read rows")
	}
	if !mustParse(t, foldYAML).FoldReadsRow() {
		t.Error("a fold-mode projection is taken not to read rows")
	}
}

// The folds compiled from a file read events through Event.Field, a Go
// fold reads their Fields.
func TestReadsFieldsMap(t *testing.T) {
	for _, src := range []string{snapshotYAML, foldYAML} {
		p := mustParse(t, src)
		if p.ReadsFieldsMap() {
			t.Errorf("%s projection: its compiled fold is taken to read Fields", p.Mode)
		}
		compiled := p.Compiled()
		p.Fold = func(r projection.Row, ev projection.Event) (projection.Row, error) { return compiled(r, ev) }
		if !p.ReadsFieldsMap() {
			t.Errorf("%s projection with a Go fold: taken not to read Fields", p.Mode)
		}
	}
	ev := projection.NewEvent("k", 1, "T", []string{"a", "b"}, []any{int64(1), nil})
	if v, ok := ev.Field("b"); !ok || v != nil || ev.Tombstone() {
		t.Errorf("NewEvent: field b %v %v, tombstone %v; want a nil value present, not a tombstone", v, ok, ev.Tombstone())
	}
	if _, ok := ev.Field("c"); ok {
		t.Error("NewEvent: field c is present")
	}
	if !(projection.Event{Key: "k"}).Tombstone() {
		t.Error("an event without a record is not a tombstone")
	}
}

// FoldOwned gives the rows Fold gives, writing into the row it is handed
// for a declarative fold-mode projection, and leaves that row unchanged
// when the event does not fold.
func TestFoldOwned(t *testing.T) {
	p := mustParse(t, foldYAML)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	events := []projection.Event{
		{Type: "Opened", Fields: map[string]any{"owner": "ann", "occurred_at": at}},
		{Type: "Deposited", Fields: map[string]any{"amount": int64(50), "bonus": 0.5}},
		{Type: "Deposited", Fields: map[string]any{"amount": "not a number", "bonus": 0.5}}, // fails
		{Type: "Withdrawn", Fields: map[string]any{"amount": int64(20)}},
		{Type: "Renamed", Fields: map[string]any{}}, // no new_owner: fails
		{Type: "Somebody else's", Fields: map[string]any{"x": 1}},
		{Type: "Renamed", Fields: map[string]any{"new_owner": "bob"}},
		{Type: "Leveled", Fields: map[string]any{"lvl": int64(1) << 40}}, // out of integer's range: fails
		{Type: "Cleared", Fields: map[string]any{}},
		{Type: "Penalised", Fields: map[string]any{"fine": 0.25}},
		{Type: "Closed", Fields: map[string]any{}},
		{Type: "Opened", Fields: map[string]any{"owner": "cy", "occurred_at": at}},
	}
	var viaFold, owned projection.Row
	for i, ev := range events {
		ev.Key, ev.Version = "k", int64(i+1)
		want, wantErr := p.Apply(viaFold, ev)
		before := copyRow(owned)
		got, err := p.FoldOwned(owned, ev)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("event %d (%s): FoldOwned error %v, Fold error %v", i, ev.Type, err, wantErr)
		}
		if err != nil {
			if !reflect.DeepEqual(owned, before) {
				t.Errorf("event %d (%s) failed and changed the row: %v, was %v", i, ev.Type, owned, before)
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d (%s): FoldOwned %v, Fold %v", i, ev.Type, got, want)
		}
		if owned != nil && got != nil && reflect.ValueOf(got).Pointer() != reflect.ValueOf(owned).Pointer() {
			t.Errorf("event %d (%s): FoldOwned copied the row it owns", i, ev.Type)
		}
		viaFold, owned = want, got
	}
	if owned == nil || owned["owner"] != "cy" {
		t.Errorf("final row %v, want the reopened account", owned)
	}

	// Any other fold is called as it is.
	calls := 0
	p.Fold = func(state projection.Row, ev projection.Event) (projection.Row, error) {
		calls++
		return projection.Row{"id": ev.Key}, nil
	}
	row := projection.Row{"id": "k", "owner": "x"}
	if got, err := p.FoldOwned(row, projection.Event{Key: "k", Type: "Opened", Fields: map[string]any{}}); err != nil || calls != 1 || len(got) != 1 || row["owner"] != "x" {
		t.Errorf("FoldOwned with a Go fold = %v, %v after %d calls (row %v)", got, err, calls, row)
	}
}

// A snapshot projection's FoldOwned gives the rows Fold gives, rebuilds in
// place a row it owns, never writes into an empty row (one that only says
// a row exists, which a sink may share), and leaves the row unchanged when
// a value does not convert.
func TestSnapshotFoldOwned(t *testing.T) {
	p := mustParse(t, snapshotYAML)
	events := []projection.Event{
		{Type: "Updated", Fields: map[string]any{"name": "Al", "total": int64(1), "ok": true}},
		{Type: "Updated", Fields: map[string]any{"name": "Bo", "total": int32(7), "data": []byte{0xde}}},
		{Type: "Updated", Fields: map[string]any{"name": "x", "total": "many"}}, // fails
		{Type: "Updated", Fields: map[string]any{"name": "Cy"}},
		{Type: "Removed", Fields: map[string]any{}},
		{Type: "Updated", Fields: map[string]any{"name": "Di", "ok": false}},
	}
	present := projection.Row{}
	var owned projection.Row = present
	for i, ev := range events {
		ev.Key, ev.Version = "k", int64(i+1)
		want, wantErr := p.Apply(nil, ev)
		before := copyRow(owned)
		got, err := p.FoldOwned(owned, ev)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("event %d: FoldOwned error %v, Fold error %v", i, err, wantErr)
		}
		if len(present) != 0 {
			t.Fatalf("event %d: FoldOwned wrote into the empty row: %v", i, present)
		}
		if err != nil {
			if !reflect.DeepEqual(owned, before) {
				t.Errorf("event %d failed and changed the row: %v, was %v", i, owned, before)
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d: FoldOwned %v, Fold %v", i, got, want)
		}
		if len(owned) > 0 && got != nil && reflect.ValueOf(got).Pointer() != reflect.ValueOf(owned).Pointer() {
			t.Errorf("event %d: FoldOwned copied the row it owns", i)
		}
		owned = got
	}
	if owned["full_name"] != "Di" || owned["ok"] != false || owned["total"] != nil {
		t.Errorf("final row %v, want the last snapshot", owned)
	}
}

// ReadFields names every field a declarative projection's fold reads, so
// that only those need decoding; a Go fold may read any.
func TestReadFields(t *testing.T) {
	p := mustParse(t, foldYAML)
	want := sorted([]string{"amount", "bonus", "fine", "id", "lvl", "new_owner", "occurred_at", "owner", p.TypeField, p.VersionField})
	if got := p.ReadFields(); !reflect.DeepEqual(got, want) {
		t.Errorf("fold mode: ReadFields = %v, want %v", got, want)
	}
	snap := mustParse(t, snapshotYAML)
	// full_name is read from the field name; the type field names deletes.
	if got, want := snap.ReadFields(), []string{"data", "id", "name", "ok", "total", "type", snap.VersionField}; !reflect.DeepEqual(got, sorted(want)) {
		t.Errorf("snapshot: ReadFields = %v, want %v", got, sorted(want))
	}
	snap.Fold = func(r projection.Row, ev projection.Event) (projection.Row, error) { return r, nil }
	if got := snap.ReadFields(); got != nil {
		t.Errorf("Go fold: ReadFields = %v, want nil (every field)", got)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
