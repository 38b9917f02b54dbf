package repair

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/projector-dev/projector/projection"
)

// fixture is what a repair source holds. A source is either snapshot-shaped
// (snapshots set) or events-shaped (events non-nil), never both.
type fixture struct {
	snapshots []snapshotRow
	events    []eventRow
}

type snapshotRow struct {
	key     string
	version int64
	state   string // a JSON object
}

type eventRow struct {
	key     string
	version int64
	typ     string
	fields  string // a JSON object, "" for none (a tombstone)
}

func (f fixture) eventsShaped() bool { return f.events != nil }

// runConformance checks the behaviour every Repairer shares. newRepairer
// returns a source serving data.
func runConformance(t *testing.T, newRepairer func(t *testing.T, data fixture) Repairer) {
	t.Helper()

	snapshots := fixture{snapshots: []snapshotRow{
		{"a", 4, `{"id":"a","n":3,"f":1.5,"whole":2.0,"ok":true,"name":"x y","none":null,"tags":["t",1],"meta":{"k":{"v":1}}}`},
		{"old", 2, `{"id":"old"}`},
		{"exact", 3, `{"id":"exact"}`},
	}}
	events := fixture{events: []eventRow{
		// Out of order, with history before the missing version.
		{"a", 5, "deleted", ""},
		{"a", 3, "created", `{"id":"a","n":1,"f":0.25,"nested":{"xs":[1,2.5,"s"],"b":false}}`},
		{"a", 1, "created", `{"id":"a"}`},
		{"a", 4, "", `{"n":2}`},
		{"a", 2, "renamed", `{"name":"z"}`},
		{"other", 3, "created", `{"id":"other"}`},
		{"behind", 1, "created", `{}`},
		{"behind", 2, "renamed", `{}`},
		{"hole", 3, "created", `{}`},
		{"hole", 4, "x", `{}`},
		{"hole", 7, "x", `{}`},
		{"late", 5, "created", `{}`},
		{"late", 6, "x", `{}`},
		{"dup", 3, "created", `{}`},
		{"dup", 3, "created", `{"again":true}`},
	}}

	t.Run("snapshot found", func(t *testing.T) {
		t.Parallel()
		r := newRepairer(t, snapshots)
		got, err := r.Repair(t.Context(), "a", 3)
		if err != nil {
			t.Fatalf("Repair: %v", err)
		}
		want := Result{Version: 4, Snapshot: projection.Row{
			"id": "a", "n": int64(3), "f": 1.5, "whole": int64(2), "ok": true, "name": "x y", "none": nil,
			"tags": `["t",1]`, "meta": `{"k":{"v":1}}`,
		}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Repair = %#v\nwant %#v", got, want)
		}
		got, err = r.Repair(t.Context(), "exact", 3)
		if err != nil {
			t.Fatalf("Repair at exactly the missing version: %v", err)
		}
		if got.Version != 3 || got.Snapshot["id"] != "exact" || got.Events != nil {
			t.Fatalf("Repair at exactly the missing version = %#v", got)
		}
	})

	t.Run("events found", func(t *testing.T) {
		t.Parallel()
		r := newRepairer(t, events)
		got, err := r.Repair(t.Context(), "a", 3)
		if err != nil {
			t.Fatalf("Repair: %v", err)
		}
		want := Result{Version: 5, Events: []projection.Event{
			{Key: "a", Version: 3, Type: "created", Fields: map[string]any{
				"id": "a", "n": int64(1), "f": 0.25,
				"nested": map[string]any{"xs": []any{int64(1), 2.5, "s"}, "b": false},
			}},
			{Key: "a", Version: 4, Type: "", Fields: map[string]any{"n": int64(2)}},
			{Key: "a", Version: 5, Type: "deleted", Fields: nil},
		}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Repair = %#v\nwant %#v", got, want)
		}
		got, err = r.Repair(t.Context(), "a", 5)
		if err != nil || got.Version != 5 || len(got.Events) != 1 || got.Events[0].Version != 5 {
			t.Fatalf("Repair of the last version = %#v, %v", got, err)
		}
	})

	for _, tc := range []struct {
		name string
		data fixture
	}{
		{"not found in a snapshot source", snapshots},
		{"not found in an events source", events},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRepairer(t, tc.data)
			got, err := r.Repair(t.Context(), "nobody", 3)
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Repair = %#v, %v; want ErrNotFound", got, err)
			}
			if IsTransient(err) {
				t.Errorf("IsTransient(%v) = true", err)
			}
			if !strings.Contains(err.Error(), `"nobody"`) {
				t.Errorf("error %q does not name the key", err)
			}
		})
	}

	for _, tc := range []struct {
		name string
		data fixture
		key  string
		want []string // in the error message
	}{
		{"snapshot behind", snapshots, "old", []string{"behind", "version 2"}},
		{"events behind", events, "behind", []string{"behind", "version 2"}},
		{"hole in events", events, "hole", []string{"hole", "versions 5..6", "between versions 4 and 7"}},
		{"events start after the missing version", events, "late", []string{"hole", "versions 3..4"}},
		{"duplicate event version", events, "dup", []string{"two events have version 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRepairer(t, tc.data)
			got, err := r.Repair(t.Context(), tc.key, 3)
			if err == nil {
				t.Fatalf("Repair = %#v, want an error", got)
			}
			if errors.Is(err, ErrNotFound) || IsTransient(err) {
				t.Errorf("error %v: ErrNotFound %v, transient %v; want neither", err, errors.Is(err, ErrNotFound), IsTransient(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !reflect.DeepEqual(got, Result{}) {
				t.Errorf("Repair returned %#v with its error", got)
			}
		})
	}

	t.Run("missing version below 1", func(t *testing.T) {
		t.Parallel()
		r := newRepairer(t, snapshots)
		if _, err := r.Repair(t.Context(), "a", 0); err == nil || IsTransient(err) {
			t.Fatalf("Repair(missing 0) = %v, want a non-transient error", err)
		}
	})
}
