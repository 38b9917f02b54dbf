package projector_test

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"pgregory.net/rapid"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks"
)

// contentEvent is an event of account whose record is keyed key (the
// account's own id for a good record).
func contentEvent(key string, v int64, typ, owner string, amount int64) demo.Record {
	return demo.Record{Key: key, Event: demo.Event{AccountID: key, Version: v, Type: typ, Owner: owner, Amount: amount,
		OccurredAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
}

// poisoned marks r as a record the engine must dead-letter, its value
// the event it carries.
func poisoned(t *testing.T, enc *demo.Encoder, r demo.Record, why string) demo.Record {
	t.Helper()
	raw, err := enc.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	r.Poison, r.Raw = why, raw
	return r
}

// deadLetterOffsets returns the class of every dead letter of identity by
// its record's offset (the topic has one partition).
func deadLetterOffsets(t *testing.T, pool *pgxpool.Pool, identity string) map[int64]string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT "offset", error_class FROM projector_dead_letters WHERE identity = $1`, identity)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var (
			off   int64
			class string
		)
		if err := rows.Scan(&off, &class); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[off]; dup {
			t.Errorf("offset %d dead-lettered twice", off)
		}
		out[off] = class
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// incompressible is n bytes of hex text Postgres cannot compress below
// the size of an index entry.
func incompressible(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n/2)
	if _, err := cryptorand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// waitEnd waits until identity has committed every record b produced.
func (b *bundle) waitEnd(t *testing.T, identity string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	if err := demo.WaitCommitted(ctx, b.db.Pool, identity, b.kafka.Topic, b.end, nil); err != nil {
		t.Fatalf("the partition did not reach the log end: %v", err)
	}
}

// TestRecordKeysPostgresCannotHold sends, among good events and in one
// batch, records whose key Postgres text cannot hold (a NUL byte, invalid
// UTF-8) or that is over the key limit (100 KB, once in order and once
// out of order, where it would be parked): each is dead-lettered with
// class invalid_key, and the good events around them apply. An event
// whose value a text column cannot hold is dead-lettered as
// invalid_value.
func TestRecordKeysPostgresCannotHold(t *testing.T) {
	f := faultSetup(t, demo.Options{}, 1)
	big := strings.Repeat("k", 100_000)
	records := []demo.Record{
		contentEvent("a", 1, "AccountOpened", "owner a", 0),
		poisoned(t, f.enc, contentEvent("nul\x00key", 1, "AccountOpened", "x", 0), "NUL in key"),
		contentEvent("a", 2, "Deposited", "", 10),
		poisoned(t, f.enc, contentEvent("bad\xff\xfeutf8", 1, "AccountOpened", "x", 0), "invalid UTF-8 key"),
		poisoned(t, f.enc, contentEvent("c", 1, "AccountOpened", "nul\x00owner", 0), "NUL in a text column"),
		poisoned(t, f.enc, contentEvent(big, 2, "Deposited", "", 5), "100 KB key, out of order"),
		poisoned(t, f.enc, contentEvent(big+"2", 1, "AccountOpened", "x", 0), "100 KB key, in order"),
		contentEvent("b", 1, "AccountOpened", "owner b", 0),
		contentEvent("a", 3, "Deposited", "", 5),
	}
	f.produce(t, records)
	f.records = records
	run(t, f.engine(t, "keys", projector.Config{Partition: fastRetry}))
	f.waitEnd(t, "keys", 30*time.Second)
	f.verify(t, "keys")
	got := deadLetterOffsets(t, f.db.Pool, "keys")
	want := map[int64]string{1: sinks.ClassInvalidKey, 3: sinks.ClassInvalidKey, 4: sinks.ClassInvalidValue, 5: sinks.ClassInvalidKey, 6: sinks.ClassInvalidKey}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dead letters by offset: %v, want %v", got, want)
	}
}

// TestRefusedDataIsolated turns the key limit off and sends a 100 KB key
// out of order among good events in one batch: its parked event is over
// the size of an index entry, which Postgres refuses (SQLSTATE 54000) for
// the whole transaction. The batch is applied again in halves until that
// record is alone: it alone is dead-lettered (class refused), every other
// record of the batch applies, and the key's next event, whose row
// Postgres refuses, is dead-lettered as rejected. With two projections of
// the topic, each dead-letters both records.
func TestRefusedDataIsolated(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared topic %v", shared), func(t *testing.T) {
			f := faultSetup(t, demo.Options{}, 1)
			engine, verify := f.engine, f.verify
			if shared {
				f.sharedTopic(t)
				engine = func(t *testing.T, identity string, cfg projector.Config) *projector.Engine {
					return f.sharedEngine(t, identity, cfg, false)
				}
				verify = f.verifyShared
			}
			big := incompressible(t, 100_000)
			var first []demo.Record
			for i := range 20 {
				first = append(first, contentEvent(fmt.Sprintf("acct-%d", i), 1, "AccountOpened", "owner", 0))
				if i == 13 {
					first = append(first, poisoned(t, f.enc, contentEvent(big, 2, "Deposited", "", 5), "parked event too large to index"))
				}
			}
			f.produce(t, first)
			cfg := fastRetry
			cfg.MaxKeyBytes = -1
			run(t, engine(t, "isolate", projector.Config{Partition: cfg}))
			f.records = first
			f.waitEnd(t, "isolate", 30*time.Second)
			verify(t, "isolate")

			second := []demo.Record{poisoned(t, f.enc, contentEvent(big, 1, "AccountOpened", "x", 0), "row key too large to index")}
			f.produce(t, second)
			f.records = append(f.records, second...)
			f.waitEnd(t, "isolate", 30*time.Second)
			verify(t, "isolate")
			rows, err := f.db.Pool.Query(t.Context(), `SELECT projection, "offset", error_class FROM projector_dead_letters ORDER BY 1, 2`)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rows.Next() {
				var (
					proj, class string
					off         int64
				)
				if err := rows.Scan(&proj, &off, &class); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s@%d:%s", proj, off, class))
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, p := range f.projs {
				want = append(want, fmt.Sprintf("%s@14:%s", p.Name, sinks.ClassRefused), fmt.Sprintf("%s@21:%s", p.Name, sinks.ClassRejected))
			}
			slices.Sort(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("dead letters: %v, want %v", got, want)
			}
		})
	}
}

// TestRandomRecordContent is a property: whatever bytes records carry as
// keys and values (NUL, invalid UTF-8, control characters, 100 KB, empty,
// random bytes, valid events mixed in), the partition reaches the log end, every record
// either lands or is dead-lettered, only for a reason it has, and the
// table equals the reference fold of the records that landed. Small
// batches make the worker commit several in one transaction, so that a
// refused one is applied again batch by batch too.
func TestRandomRecordContent(t *testing.T) {
	if !flagSet("rapid.checks") {
		// Each check runs an engine end to end: a few are enough to keep
		// make test short; -rapid.checks asks for more.
		f := flag.Lookup("rapid.checks")
		old := f.Value.String()
		if err := f.Value.Set("8"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Value.Set(old) }) //nolint:errcheck // it took the value before
	}
	// One broker, registry and database for every check; each has a
	// topic and identity of its own, and the table to itself.
	f := faultSetup(t, demo.Options{}, 1)
	adm := kadm.NewClient(f.kafkaClient(t))
	check := 0
	rapid.Check(t, func(rt *rapid.T) {
		check++
		identity := fmt.Sprintf("random%d", check)
		ctx := t.Context()
		topic := f.kafka.Name(identity)
		f.kafka.CreateTopic(topic, 1, nil)
		enc, err := demo.RegisterSchemasFor(ctx, f.reg, topic)
		if err != nil {
			t.Fatal(err)
		}
		b := *f.bundle
		b.enc = enc
		b.projs = nil
		for _, p := range f.projs {
			c := *p
			c.Topic = topic
			b.projs = append(b.projs, &c)
		}
		if _, err := f.db.Pool.Exec(ctx, `TRUNCATE `+demo.Table+`, projector_tombstones`); err != nil {
			t.Fatal(err)
		}
		bad := map[int]string{} // index → the class its content must give it
		big := incompressible(t, 100_000)
		tainted := map[string]bool{}
		var records []demo.Record
		next := map[string]int64{}
		// With the key limit off, Postgres refuses a 100 KB key's writes
		// itself: its row (rejected) or its parked event (refused).
		limitOff := rapid.Bool().Draw(rt, "limit off")
		accounts := rapid.IntRange(1, 5).Draw(rt, "accounts")
		n := rapid.IntRange(5, 60).Draw(rt, "records")
		for i := range n {
			kind := rapid.SampledFrom([]string{"good", "good", "good", "nul key", "invalid key", "control key", "100 KB key",
				"empty key", "random key", "random value", "owner NUL", "owner invalid", "owner control", "owner 100 KB"}).Draw(rt, fmt.Sprintf("kind%d", i))
			key := fmt.Sprintf("acct-%d", rapid.IntRange(0, accounts-1).Draw(rt, fmt.Sprintf("account%d", i)))
			owner := "owner"
			switch kind {
			case "nul key":
				key = "k\x00" + key
			case "invalid key":
				key = key + "\xc3\x28"
			case "control key":
				key = "\x01\x1f\x7f" + key
			case "100 KB key":
				key = big
			case "random key":
				key = string(rapid.SliceOfN(rapid.Byte(), 0, 12).Draw(rt, fmt.Sprintf("key%d", i)))
			case "empty key":
				key = ""
			case "owner NUL":
				owner = "a\x00b"
			case "owner invalid":
				owner = "a\xffb"
			case "owner control":
				owner = "\x01\x02\x1b[0m"
			case "owner 100 KB":
				owner = strings.Repeat("o", 100_000)
			}
			// Mostly the next version, sometimes a stale copy or a gap.
			v := next[key] + int64(rapid.SampledFrom([]int{1, 1, 1, 0, 2}).Draw(rt, fmt.Sprintf("step%d", i)))
			v = max(v, 1)
			next[key] = max(next[key], v)
			typ := "Deposited"
			if v == 1 {
				typ = "AccountOpened"
			}
			r := contentEvent(key, v, typ, owner, int64(i))
			switch {
			case kind == "100 KB key" && limitOff:
				r = poisoned(t, enc, r, kind)
				bad[i] = sinks.ClassRejected + " or " + sinks.ClassRefused
			case kind == "nul key" || kind == "invalid key" || kind == "100 KB key" || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
				r = poisoned(t, enc, r, kind)
				bad[i] = sinks.ClassInvalidKey
			case kind == "random value":
				raw := rapid.SliceOfN(rapid.Byte(), 1, 64).Draw(rt, fmt.Sprintf("value%d", i))
				raw[0] |= 0x80 // no magic byte: a terminal decode error rather than a schema id to look up
				r.Poison, r.Raw = kind, raw
				bad[i] = sinks.ClassDecode
			case kind == "owner NUL" || kind == "owner invalid":
				if typ == "AccountOpened" { // the fold writes the owner of the event that opens the account
					tainted[key] = true
				}
			}
			records = append(records, r)
		}
		b.produce(t, records) // to the encoder's topic
		end, err := demo.EndOffsets(ctx, adm, topic)
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastRetry
		cfg.BatchMaxRecords, cfg.CommitMaxBatches = 4, 4
		if limitOff {
			cfg.MaxKeyBytes = -1
		}
		stop := run(t, b.engine(t, identity, projector.Config{Partition: cfg}))
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a second or two when it passes
		defer cancel()
		if err := demo.WaitCommitted(wctx, f.db.Pool, identity, topic, end, nil); err != nil {
			rt.Fatalf("the partition did not reach the log end: %v", err)
		}
		stop()

		dead := deadLetterOffsets(t, f.db.Pool, identity)
		landed := make([]demo.Record, len(records))
		for i, r := range records {
			class, isDead := dead[int64(i)]
			switch want, must := bad[i]; {
			case must && !slices.Contains(strings.Split(want, " or "), class):
				rt.Errorf("record %d (%s): dead letter class %q, want %q", i, r.Poison, class, want)
			case !must && isDead && (!tainted[r.Key] || class != sinks.ClassInvalidValue):
				rt.Errorf("record %d of %q v%d dead-lettered as %q, though nothing in it or its account is bad", i, r.Key, r.Event.Version, class)
			}
			landed[i] = r
			if isDead && r.Poison == "" {
				landed[i].Poison = "refused by postgres: " + class
			}
		}
		exp := demo.Fold(landed)
		if err := demo.Verify(t.Context(), f.db.Pool, demo.Table, exp); err != nil {
			rt.Fatal(err)
		}
		if len(dead) != exp.Poison {
			rt.Errorf("%d dead letters, want %d", len(dead), exp.Poison)
		}
		var parked int
		if err := f.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM projector_parked WHERE identity = $1`, identity).Scan(&parked); err != nil {
			rt.Fatal(err)
		}
		if parked != exp.Parked {
			rt.Errorf("%d parked events, want %d: applied %d + stale %d + parked %d + dead %d of %d records",
				parked, exp.Parked, exp.Applied, exp.Stale, exp.Parked, exp.Poison, len(records))
		}
	})
}

// flagSet reports whether the named flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
