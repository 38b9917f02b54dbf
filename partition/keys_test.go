package partition

import (
	"errors"
	"reflect"
	"testing"

	"github.com/projector-dev/projector/sinks"
)

func TestBatchKeys(t *testing.T) {
	ev := func(key string, version int64) *item { return &item{key: key, version: version} }
	tomb := &item{key: "tomb", tombstone: true}
	bad := ev("bad", 1)
	bad.fail(sinks.ClassDecode, errors.New("x"))
	items := []*item{
		ev("a", 1), ev("b", 2), ev("a", 2), ev("c", 3), ev("c", 1), // c: out of order, starts at 1
		ev("tomb", 1), tomb, ev("parked", 1), bad, ev("gap", 1), ev("gap", 3), ev("zero", 0), ev("zero", 1),
	}
	got := batchKeys(items, func(k string) bool { return k == "parked" }, nil)
	want := sinks.Keys{
		All:    []string{"a", "b", "c", "tomb", "parked", "gap", "zero"},
		Parked: []string{"parked"},
		New:    []string{"a", "c", "gap"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("batchKeys =\n%+v\nwant\n%+v", got, want)
	}
	for _, it := range items {
		if it.err == nil && got.All[it.agg] != it.key {
			t.Errorf("item of %q v%d indexes aggregate %d, %q", it.key, it.version, it.agg, got.All[it.agg])
		}
	}
}
