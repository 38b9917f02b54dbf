package bench

import (
	"bytes"
	"maps"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/schemas"
)

// TestAppendValueMatchesRegistryEncoder checks the hand-written encoder
// against the registry encoder, and that the projection's v1 reader reads
// its values back.
func TestAppendValueMatchesRegistryEncoder(t *testing.T) {
	recs, err := Generate(GenOptions{Events: 2000, Aggregates: 50, CloseEvery: 5, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	writer, err := avro.Parse(WriterSchema)
	if err != nil {
		t.Fatal(err)
	}
	reg := srfake.New()
	defer reg.Close()
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := cl.CreateSchema(t.Context(), "t-value", sr.Schema{Schema: WriterSchema, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := ReaderSchema()
	if err != nil {
		t.Fatal(err)
	}
	dec := schemas.NewDecoder(cl, reader)
	for _, size := range []int{0, 60, 200, 1000} {
		for _, r := range recs[:300] {
			got := AppendValue(nil, ss.ID, r.Event, size)
			padLen := 0
			if size > 0 {
				// Recover the padding the encoder chose, and encode the same
				// with the registry encoder.
				unpadded := AppendValue(nil, ss.ID, r.Event, 0)
				padLen = len(got) - len(unpadded)
				if padLen > 64 {
					padLen -= 1
				}
			}
			ev := r.Event
			v := map[string]any{"account_id": ev.AccountID, "version": ev.Version, "type": ev.Type, "owner": nil,
				"amount": ev.Amount, "occurred_at": ev.OccurredAt, "padding": filler[:padLen]}
			if ev.Owner != "" {
				v["owner"] = ev.Owner
			}
			want, err := schemas.AppendWire(nil, ss.ID, writer, v)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("size %d, %+v:\n got %x\nwant %x", size, ev, got, want)
			}
			if size >= 200 && len(got) < size-2 || size >= 200 && len(got) > size+1 {
				t.Fatalf("size %d: value of %d bytes", size, len(got))
			}
			rec, _, err := dec.Decode(t.Context(), got)
			if err != nil {
				t.Fatal(err)
			}
			if rec["account_id"] != ev.AccountID || rec["version"] != ev.Version || rec["type"] != ev.Type || rec["amount"] != ev.Amount {
				t.Fatalf("decoded %v, want %+v", rec, ev)
			}
		}
	}
}

// TestGenerate checks the stream's shape: exact count, versions in order
// per aggregate, closes only as the last event, and every prefix folds.
func TestGenerate(t *testing.T) {
	for _, skew := range []string{SkewUniform, SkewZipf} {
		recs, err := Generate(GenOptions{Events: 50_000, Aggregates: 1000, Skew: skew, CloseEvery: DefaultCloseEvery, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 50_000 {
			t.Fatalf("%s: %d records", skew, len(recs))
		}
		last := map[string]demo.Event{}
		for _, r := range recs {
			prev := last[r.Key]
			if r.Event.Version != prev.Version+1 {
				t.Fatalf("%s: %s v%d after v%d", skew, r.Key, r.Event.Version, prev.Version)
			}
			if prev.Type == "AccountClosed" {
				t.Fatalf("%s: %s has an event after it closed", skew, r.Key)
			}
			last[r.Key] = r.Event
		}
		exp := demo.Fold(recs)
		if exp.Applied != len(recs) || exp.Stale != 0 || exp.Parked != 0 || exp.Poison != 0 {
			t.Fatalf("%s: fold %+v", skew, exp)
		}
		if skew == SkewZipf {
			hottest := 0
			for _, e := range last {
				hottest = max(hottest, int(e.Version))
			}
			if hottest < 1000 {
				t.Errorf("zipf: the hottest account has only %d events", hottest)
			}
		}
	}
}

// With Reorder a share of each account's events change places with the
// next one: the stream folds to what it folds to in order, with that
// share of events arriving before the version they follow.
func TestGenerateReorders(t *testing.T) {
	o := GenOptions{Events: 50_000, Aggregates: 2_000, CloseEvery: DefaultCloseEvery, Seed: 9}
	inOrder, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	o.Reorder = 0.1
	recs, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(inOrder) {
		t.Fatalf("%d records, want %d", len(recs), len(inOrder))
	}
	early := 0
	last := map[string]int64{}
	for _, r := range recs {
		if r.Event.Version < last[r.Key] {
			early++ // a version arriving after the one it precedes
		}
		last[r.Key] = max(last[r.Key], r.Event.Version)
	}
	if share := float64(early) / float64(len(recs)); share < 0.07 || share > 0.1 {
		t.Errorf("%d of %d events (%.3f) arrive after their next one, want about 0.1 of those that have one", early, len(recs), share)
	}
	want, got := demo.Fold(inOrder), demo.Fold(recs)
	if !maps.Equal(got.Accounts, want.Accounts) || got.Applied != len(recs) || got.Parked != 0 {
		t.Errorf("reordered stream folds to %d accounts (%d applied, %d parked), want %d accounts as in order",
			len(got.Accounts), got.Applied, got.Parked, len(want.Accounts))
	}
}

// TestDuplicateSendsStaleCopies checks that Duplicate adds copies of
// events after a newer event of their account, which the reference fold
// counts as stale and which leave every account's last version as without
// them.
func TestDuplicateSendsStaleCopies(t *testing.T) {
	o := GenOptions{Events: 20_000, Aggregates: 500, CloseEvery: 5, Reorder: 0.05, Seed: 9}
	plain, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	o.Duplicate = 0.1
	dup, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	copies := len(dup) - len(plain)
	if copies < 1500 || copies > 2500 {
		t.Fatalf("%d copies of %d events, want about a tenth", copies, len(plain))
	}
	if exp := demo.Fold(dup); exp.Stale != copies || exp.Parked != 0 {
		t.Fatalf("fold: %d stale, %d parked; want %d stale, none parked", exp.Stale, exp.Parked, copies)
	}
	if !maps.Equal(demo.Fold(dup).Snapshots, demo.Fold(plain).Snapshots) {
		t.Fatal("the copies changed the reference fold's rows")
	}
	newest := map[string]int64{}
	lastIsStale := 0
	last := map[string]int64{}
	for _, r := range dup {
		newest[r.Key] = max(newest[r.Key], r.Event.Version)
		last[r.Key] = r.Event.Version
	}
	for k, v := range last {
		if v < newest[k] {
			lastIsStale++
		}
	}
	if lastIsStale == 0 {
		t.Fatal("no account's last record is older than its newest: a sink without a version gate would be right")
	}
}
