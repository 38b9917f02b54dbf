package schemas

import (
	"reflect"
	"testing"

	"github.com/hamba/avro/v2"
)

// A pruned reader decodes only the fields it keeps, from writers with
// more fields (v2 adds currency), and still names what it keeps as the
// full reader does.
func TestPrune(t *testing.T) {
	e := newEnv(t)
	keep := []string{"account_id", "version", "amount", "not in the schema"}
	pruned := Prune(e.v2, keep)
	for _, w := range []struct {
		id    int
		value map[string]any
	}{{e.v1ID, event()}, {e.v2ID, eventV2()}} {
		full, _ := mustDecode(t, NewDecoder(e.cl, e.v2), wire(t, w.id, schemaOf(e, w.id), w.value))
		got, _ := mustDecode(t, NewDecoder(e.cl, pruned), wire(t, w.id, schemaOf(e, w.id), w.value))
		want := map[string]any{"account_id": full["account_id"], "version": full["version"], "amount": full["amount"]}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("writer %d through the pruned reader = %v, want %v", w.id, got, want)
		}
	}
	if Prune(e.v1, nil) != e.v1 {
		t.Error("Prune with nothing to keep named changed the reader")
	}
	all := []string{"account_id", "version", "type", "owner", "amount", "occurred_at"}
	if Prune(e.v1, all) != e.v1 {
		t.Error("Prune keeping every field built a new reader")
	}
}

func schemaOf(e *env, id int) avro.Schema {
	if id == e.v1ID {
		return e.v1
	}
	return e.v2
}
