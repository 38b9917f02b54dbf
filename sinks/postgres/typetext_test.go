package postgres_test

import (
	"encoding/json"
	"math/big"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
)

// TestTextFormsPostgresReads holds the text forms projection writes
// arrays, JSON and decimals in to what Postgres reads from them: random
// strings (quotes, backslashes, braces, commas, blanks, NULL, non-ASCII)
// through a text[] literal and a jsonb document, random decimals through
// numeric, each read back as Go values and compared with what was
// converted.
func TestTextFormsPostgresReads(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := t.Context()
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", " ", "\t", "\n", `"`, `\`, "{", "}", ",", "NULL", "null", "é", "日", "'", "[", "]", ":"}
	word := func() string {
		var b strings.Builder
		for range rnd.IntN(6) {
			b.WriteString(alphabet[rnd.IntN(len(alphabet))])
		}
		return b.String()
	}
	arr := projection.Column{Name: "tags", Type: "text[]"}
	js := projection.Column{Name: "doc", Type: "jsonb"}
	num := projection.Column{Name: "amount", Type: "numeric"}
	for i := range 300 {
		var in []any
		var want []*string
		for range rnd.IntN(5) {
			if rnd.IntN(6) == 0 {
				in, want = append(in, nil), append(want, nil)
				continue
			}
			w := word()
			in, want = append(in, w), append(want, &w)
		}
		if in == nil {
			in, want = []any{}, []*string{}
		}
		lit, err := arr.Convert(in)
		if err != nil {
			t.Fatal(err)
		}
		var got []*string
		if err := db.Pool.QueryRow(ctx, `SELECT $1::text::text[]`, lit).Scan(&got); err != nil {
			t.Fatalf("case %d: %q::text[]: %v", i, lit, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d: %q read as %q, want %q", i, lit, showAll(got), showAll(want))
		}

		doc := map[string]any{word(): in, "n": big.NewRat(rnd.Int64N(1e12)-5e11, 1e4)}
		text, err := js.Convert(doc)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := db.Pool.QueryRow(ctx, `SELECT $1::text::jsonb::text`, text).Scan(&back); err != nil {
			t.Fatalf("case %d: %q::jsonb: %v", i, text, err)
		}
		var a, b any
		if err := json.Unmarshal([]byte(text.(string)), &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(back), &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("case %d: %s read back as %s", i, text, back)
		}

		r := new(big.Rat).SetFrac(big.NewInt(rnd.Int64()-rnd.Int64()), new(big.Int).Exp(big.NewInt(10), big.NewInt(rnd.Int64N(30)), nil))
		dec, err := num.Convert(r)
		if err != nil {
			t.Fatal(err)
		}
		var stored string
		if err := db.Pool.QueryRow(ctx, `SELECT $1::text::numeric::text`, dec).Scan(&stored); err != nil {
			t.Fatalf("case %d: %q::numeric: %v", i, dec, err)
		}
		if s, ok := new(big.Rat).SetString(stored); !ok || s.Cmp(r) != 0 {
			t.Fatalf("case %d: %s written as %q, stored as %q", i, r.RatString(), dec, stored)
		}
	}
}

func showAll(p []*string) []string {
	out := make([]string, len(p))
	for i, s := range p {
		if s == nil {
			out[i] = "<NULL>"
		} else {
			out[i] = *s
		}
	}
	return out
}
