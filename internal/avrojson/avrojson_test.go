package avrojson

import (
	"math"
	"math/big"
	"testing"
	"time"
)

func rat(s string) *big.Rat {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		panic(s)
	}
	return r
}

func TestDecimalIsExact(t *testing.T) {
	for in, want := range map[string]string{
		"0": "0", "-5": "-5", "12.50": "12.5", "-0.000001": "-0.000001",
		"123456789012345678901234567890.123456789012345678": "123456789012345678901234567890.123456789012345678",
		"1/8": "0.125", "-1/3": "-0.33333333333333333333333333333333333333",
	} {
		if got := Decimal(rat(in)); got != want {
			t.Errorf("Decimal(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestMarshal(t *testing.T) {
	loc := time.FixedZone("x", 3600)
	for _, c := range []struct {
		in   any
		want string
	}{
		{nil, `null`},
		{map[string]any{"b": []any{int64(1), nil, 1.5, float32(0.25), true}, "a": "<&>\"\\\n\x01"}, `{"a":"<&>\"\\\n\u0001","b":[1,null,1.5,0.25,true]}`},
		{[]byte{0xde, 0xad}, `"3q0="`},
		{[4]byte{1, 2, 3, 4}, `"AQIDBA=="`},
		{rat("-1.05"), `-1.05`},
		{time.UnixMicro(-1).UTC(), `"1969-12-31T23:59:59.999999Z"`},
		{time.Date(2024, 2, 29, 1, 2, 3, 0, loc), `"2024-02-29T01:02:03"`},
		{13*time.Hour + 5*time.Millisecond, `"13:00:00.005000"`},
		{map[string]any{}, `{}`},
		{[]any{}, `[]`},
	} {
		got, err := Marshal(c.in)
		if err != nil || string(got) != c.want {
			t.Errorf("Marshal(%#v) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	if _, err := Marshal([]any{math.NaN()}); err == nil {
		t.Error("Marshal(NaN): no error")
	}
}
