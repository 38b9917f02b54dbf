package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/sinks"
	"github.com/projector-dev/projector/sinks/postgres"
)

// dlqEnv is a migrated database with dead letters, a Kafka cluster with
// the demo topic and a registry with the demo schemas.
type dlqEnv struct {
	t       *testing.T
	db      *testenv.DB
	kafka   *testenv.Cluster
	regURL  string
	good    []byte // a real Avro value of acc-1 v1
	ids     map[string]int64
	brokers string
}

func newDLQEnv(t *testing.T) *dlqEnv {
	t.Helper()
	ctx := t.Context()
	e := &dlqEnv{t: t, db: testenv.NewDB(t), ids: map[string]int64{}}
	if err := postgres.Migrate(ctx, e.db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	e.kafka = testenv.NewCluster(t, demo.Topic, 3)
	e.brokers = strings.Join(e.kafka.Addrs(), ",")
	reg := testenv.NewRegistry(t)
	srcl := reg.Client
	e.regURL = reg.URL
	enc, err := demo.RegisterSchemasFor(ctx, srcl, e.kafka.Topic)
	if err != nil {
		t.Fatal(err)
	}
	e.good, err = enc.Encode(demo.Record{Key: "acc-1", Event: demo.Event{
		AccountID: "acc-1", Version: 1, Type: "AccountOpened", Owner: "Ada Lovelace", Amount: 0,
		OccurredAt: time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC),
	}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	hdrs := []sinks.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}, {Key: "raw", Value: []byte{0xff, 0xfe, 0x00}}}
	e.insert("good", "ident", "accounts", 2, 10, "acc-1", e.good, hdrs, "fold", "open", "fold refused: insufficient funds", now.Add(-2*time.Hour))
	e.insert("garbage", "ident", "accounts", 0, 11, "acc-2", []byte("not avro"), nil, "decode", "open", "malformed wire-format value", now.Add(-3*24*time.Hour))
	e.insert("ledger", "ident", "ledger", 1, 12, "acc-1", e.good, nil, "rejected", "open", "value out of range", now.Add(-time.Hour))
	e.insert("resolved", "ident", "accounts", 1, 13, "acc-3", e.good, nil, "fold", "resolved", "fixed", now.Add(-time.Hour))
	e.insert("other", "second", "accounts", 0, 14, "acc-4", e.good, nil, "decode", "open", "unknown schema id", now.Add(-time.Hour))
	e.insert("purged", "ident", "accounts", 0, 15, "acc-5", e.good, nil, "decode", "purged", "gone", now.Add(-time.Hour))
	return e
}

func (e *dlqEnv) insert(name, identity, projection string, part int32, offset int64, key string, value []byte, headers []sinks.Header, class, status, errText string, firstSeen time.Time) {
	e.t.Helper()
	hs := []byte("[]")
	if headers != nil {
		hs, _ = json.Marshal(headers)
	}
	var id int64
	err := e.db.Pool.QueryRow(e.t.Context(), `INSERT INTO projector_dead_letters
		(identity, projection, topic, partition, "offset", record_key, value, headers, error, error_class, status, first_seen, last_seen)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $12) RETURNING id`,
		identity, projection, e.kafka.Topic, part, offset, []byte(key), value, string(hs), errText, class, status, firstSeen).Scan(&id)
	if err != nil {
		e.t.Fatalf("insert dead letter: %v", err)
	}
	e.ids[name] = id
}

func (e *dlqEnv) id(name string) string { return strconv.FormatInt(e.ids[name], 10) }

// run runs projector with args and --database-url.
func (e *dlqEnv) run(args ...string) (string, error) {
	e.t.Helper()
	var out, errs bytes.Buffer
	err := Main(e.t.Context(), append(args, "--database-url", e.db.URL), &out, &errs)
	return out.String(), err
}

func (e *dlqEnv) mustRun(args ...string) string {
	e.t.Helper()
	out, err := e.run(args...)
	if err != nil {
		e.t.Fatalf("projector %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *dlqEnv) listIDs(args ...string) []int64 {
	e.t.Helper()
	out := e.mustRun(append([]string{"dlq", "list", "--json"}, args...)...)
	var dls []deadletters.Entry
	if err := json.Unmarshal([]byte(out), &dls); err != nil {
		e.t.Fatalf("dlq list --json: %v\n%s", err, out)
	}
	ids := []int64{}
	for _, d := range dls {
		ids = append(ids, d.ID)
	}
	return ids
}

func (e *dlqEnv) audit() []deadletters.AuditEntry {
	e.t.Helper()
	a, err := deadletters.ListAudit(e.t.Context(), e.db.Pool, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

func (e *dlqEnv) produced() int64 {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(e.t.Context(), e.kafka.Topic)
	if err != nil {
		e.t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

func dlqStatus(t *testing.T, pool *pgxpool.Pool, id int64) deadletters.Entry {
	t.Helper()
	d, err := deadletters.Get(t.Context(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDLQListFilters(t *testing.T) {
	e := newDLQEnv(t)
	ids := func(names ...string) []int64 {
		out := []int64{}
		for _, n := range names {
			out = append(out, e.ids[n])
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		args []string
		want []int64
	}{
		{nil, ids("good", "garbage", "ledger", "resolved", "other", "purged")},
		{[]string{"--projection", "ledger"}, ids("ledger")},
		{[]string{"--topic", e.kafka.Topic, "--identity", "second"}, ids("other")},
		{[]string{"--topic", "elsewhere"}, ids()},
		{[]string{"--key", "acc-1"}, ids("good", "ledger")},
		{[]string{"--error-class", "decode"}, ids("garbage", "other", "purged")},
		{[]string{"--status", "open", "--projection", "accounts"}, ids("good", "garbage", "other")},
		{[]string{"--since", "24h"}, ids("good", "ledger", "resolved", "other", "purged")},
		{[]string{"--until", "24h"}, ids("garbage")},
		{[]string{"--since", "2d", "--until", time.Now().Add(-90 * time.Minute).Format(time.RFC3339)}, ids("good")},
		{[]string{"--limit", "2"}, ids("good", "garbage")},
	} {
		if got := e.listIDs(tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("dlq list %s = %v, want %v", strings.Join(tc.args, " "), got, tc.want)
		}
	}

	out := e.mustRun("dlq", "list", "--key", "acc-2")
	for _, want := range []string{"STATUS", "CLASS", e.id("garbage"), "acc-2", "decode", "malformed wire-format value"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq list table lacks %q:\n%s", want, out)
		}
	}

	for _, tc := range []struct{ args []string }{
		{[]string{"--status", "closed"}},
		{[]string{"--error-class", "keymismatch"}},
		{[]string{"--since", "yesterday"}},
		{[]string{"--until", "-5h"}},
		{[]string{"--limit", "-1"}},
	} {
		_, err := e.run(append([]string{"dlq", "list"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.args[0]) {
			t.Errorf("dlq list %s: error %v, want one naming %s", strings.Join(tc.args, " "), err, tc.args[0])
		}
	}
}

func TestDLQShow(t *testing.T) {
	e := newDLQEnv(t)

	out := e.mustRun("dlq", "show", e.id("good"), "--registry-url", e.regURL)
	for _, want := range []string{
		"projection", "accounts", "partition", "2", "offset", "10", "acc-1", "fold refused: insufficient funds",
		"error class", "fold", "status", "open", "attempts", "replays",
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"(base64) " + base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 0x00}),
		"value (decoded, schema id", `"account_id": "acc-1"`, `"owner": "Ada Lovelace"`, `"type": "AccountOpened"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, out)
		}
	}

	out = e.mustRun("dlq", "show", e.id("good"), "--registry-url", e.regURL, "--json")
	var shown struct {
		ID           int64          `json:"id"`
		Status       string         `json:"status"`
		ErrorClass   string         `json:"error_class"`
		Value        []byte         `json:"value"`
		DecodedValue map[string]any `json:"decoded_value"`
		DecodeError  string         `json:"decode_error"`
		Headers      []shownHeader  `json:"headers"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatalf("dlq show --json: %v\n%s", err, out)
	}
	if shown.ID != e.ids["good"] || shown.Status != "open" || shown.ErrorClass != "fold" || !bytes.Equal(shown.Value, e.good) ||
		shown.DecodedValue["account_id"] != "acc-1" || shown.DecodedValue["version"] != float64(1) || shown.DecodeError != "" {
		t.Errorf("dlq show --json = %s", out)
	}
	if len(shown.Headers) != 2 || shown.Headers[0].Encoding != "text" || shown.Headers[1].Encoding != "base64" ||
		*shown.Headers[1].Value != base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 0x00}) {
		t.Errorf("dlq show --json headers = %+v", shown.Headers)
	}

	// Without a registry, or with a value that is not Avro: base64 and why.
	out = e.mustRun("dlq", "show", e.id("good"))
	if !strings.Contains(out, base64.StdEncoding.EncodeToString(e.good)) || !strings.Contains(out, "no --registry-url") {
		t.Errorf("dlq show without --registry-url:\n%s", out)
	}
	out = e.mustRun("dlq", "show", e.id("garbage"), "--registry-url", e.regURL)
	if !strings.Contains(out, base64.StdEncoding.EncodeToString([]byte("not avro"))) || !strings.Contains(out, "malformed") {
		t.Errorf("dlq show of a garbage value:\n%s", out)
	}

	if _, err := e.run("dlq", "show", "987654"); err == nil || !strings.Contains(err.Error(), "no such dead letter") {
		t.Errorf("dlq show of an unknown id: %v", err)
	}
	if _, err := e.run("dlq", "show"); err == nil || !strings.Contains(err.Error(), "ID") {
		t.Errorf("dlq show without an id: %v", err)
	}
	if _, err := e.run("dlq", "show", "abc"); err == nil || !strings.Contains(err.Error(), `"abc"`) {
		t.Errorf("dlq show abc: %v", err)
	}
}

func TestDLQReplay(t *testing.T) {
	e := newDLQEnv(t)

	// A dry run (the default) prints, produces nothing, audits nothing.
	out := e.mustRun("dlq", "replay", "--projection", "accounts", "--identity", "ident")
	for _, want := range []string{"dry run", "would replay 2", e.id("good"), e.id("garbage"), "acc-1", "fold refused: insufficient funds", "--execute"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, e.id("resolved")+" ") || strings.HasPrefix(line, e.id("purged")+" ") {
			t.Errorf("dry run without --status lists an entry that is not open:\n%s", out)
		}
	}
	e.mustRun("dlq", "replay", "--id", e.id("good"), "--brokers", e.brokers)
	if n := e.produced(); n != 0 {
		t.Errorf("dry runs produced %d records", n)
	}
	if a := e.audit(); len(a) != 0 {
		t.Errorf("dry runs audited: %+v", a)
	}
	if d := dlqStatus(t, e.db.Pool, e.ids["good"]); d.Status != "open" || d.Replays != 0 {
		t.Errorf("dry run changed the entry: %+v", d)
	}

	// Refusals, each naming what is wrong; nothing produced.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--id", e.id("good"), "--execute"}, "--brokers"},
		{[]string{"--id", e.id("good"), "--execute", "--dry-run=true", "--brokers", e.brokers}, "--dry-run"},
		{[]string{"--id", e.id("good"), "--rate", "0"}, "--rate"},
		{[]string{"--id", "987654", "--execute", "--brokers", e.brokers}, "987654"},
		{[]string{"--id", "x"}, "-id"},
		{[]string{"--id", e.id("purged"), "--execute", "--brokers", e.brokers}, "purged"},
		{[]string{"--status", "purged", "--execute", "--brokers", e.brokers}, "purged"},
		{[]string{"--id", e.id("ledger"), "--projection", "accounts"}, "does not match"},
	} {
		_, err := e.run(append([]string{"dlq", "replay"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("dlq replay %s: error %v, want one naming %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if n := e.produced(); n != 0 {
		t.Fatalf("refused replays produced %d records", n)
	}

	// --execute produces the record with the header and audits.
	out = e.mustRun("dlq", "replay", "--id", e.id("good"), "--execute", "--brokers", e.brokers, "--actor", "alice", "--rate", "50")
	if !strings.Contains(out, "replayed 1 of 1") {
		t.Errorf("replay output:\n%s", out)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...), kgo.ConsumeTopics(e.kafka.Topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) == 0 && ctx.Err() == nil {
		recs = append(recs, cl.PollFetches(ctx).Records()...)
	}
	if len(recs) != 1 {
		t.Fatalf("consumed %d replayed records, want 1", len(recs))
	}
	r := recs[0]
	if string(r.Key) != "acc-1" || !bytes.Equal(r.Value, e.good) || r.Partition != 2 {
		t.Errorf("replayed record: partition %d key %q value %x", r.Partition, r.Key, r.Value)
	}
	if len(r.Headers) != 3 || r.Headers[0].Key != "traceparent" || !bytes.Equal(r.Headers[1].Value, []byte{0xff, 0xfe, 0x00}) ||
		r.Headers[2].Key != sinks.ReplayHeader || string(r.Headers[2].Value) != e.id("good") {
		t.Errorf("replayed headers = %v", r.Headers)
	}
	if d := dlqStatus(t, e.db.Pool, e.ids["good"]); d.Status != "replayed" || d.Replays != 1 || d.ReplayedAt == nil {
		t.Errorf("after replay: %+v", d)
	}
	a := e.audit()
	if len(a) != 1 || a[0].Actor != "alice" || a[0].Action != "replay" || !slices.Equal(a[0].EntryIDs, []int64{e.ids["good"]}) {
		t.Fatalf("audit after replay = %+v", a)
	}
	var f deadletters.Filter
	if err := json.Unmarshal(a[0].Filter, &f); err != nil || !slices.Equal(f.IDs, []int64{e.ids["good"]}) {
		t.Errorf("audited filter %s", a[0].Filter)
	}
	if out := e.mustRun("dlq", "audit"); !strings.Contains(out, "alice") || !strings.Contains(out, "replay") {
		t.Errorf("dlq audit:\n%s", out)
	}
}

func TestDLQPurge(t *testing.T) {
	e := newDLQEnv(t)

	out, err := e.run("dlq", "purge", "--error-class", "decode", "--identity", "ident")
	if err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("purge without --yes: error %v, want one telling to add --yes", err)
	}
	if !strings.Contains(out, "would purge 2") {
		t.Errorf("purge without --yes output:\n%s", out)
	}
	if got := e.listIDs(); len(got) != 6 {
		t.Fatalf("purge without --yes deleted entries: %v left", got)
	}
	if a := e.audit(); len(a) != 0 {
		t.Fatalf("purge without --yes audited: %+v", a)
	}
	if _, err := e.run("dlq", "purge", "--id", "987654", "--yes"); err == nil || !strings.Contains(err.Error(), "987654") {
		t.Errorf("purge of an unknown id: %v", err)
	}

	out = e.mustRun("dlq", "purge", "--error-class", "decode", "--identity", "ident", "--yes", "--actor", "bob")
	if !strings.Contains(out, "purged 2") {
		t.Errorf("purge output:\n%s", out)
	}
	want := []int64{e.ids["good"], e.ids["ledger"], e.ids["resolved"], e.ids["other"]}
	slices.Sort(want)
	if got := e.listIDs(); !slices.Equal(got, want) {
		t.Errorf("left after purge: %v, want %v", got, want)
	}
	a := e.audit()
	purged := []int64{e.ids["garbage"], e.ids["purged"]}
	slices.Sort(purged)
	if len(a) != 1 || a[0].Actor != "bob" || a[0].Action != "purge" || !slices.Equal(a[0].EntryIDs, purged) {
		t.Fatalf("audit after purge = %+v", a)
	}
	var f deadletters.Filter
	if err := json.Unmarshal(a[0].Filter, &f); err != nil || f.ErrorClass != "decode" || f.Identity != "ident" {
		t.Errorf("audited filter %s", a[0].Filter)
	}

	if out := e.mustRun("dlq", "purge", "--key", "nobody", "--yes"); !strings.Contains(out, "nothing to purge") {
		t.Errorf("purge matching nothing:\n%s", out)
	}

	// --yes must come from the command line, not the environment.
	t.Setenv("PROJECTOR_YES", "true")
	if _, err := e.run("dlq", "purge", "--yes"); err == nil || !strings.Contains(err.Error(), "PROJECTOR_YES") {
		t.Errorf("purge with PROJECTOR_YES set: error %v, want a refusal naming PROJECTOR_YES", err)
	}
	if got := e.listIDs(); len(got) != 4 {
		t.Errorf("purge with PROJECTOR_YES set deleted entries: %v left", got)
	}
}

// TestDLQQuotesLongKeysBounded: a dead letter whose key is 100 KB, with
// an error that quotes it, is listed and shown in a few hundred bytes of
// each, saying how long the whole was; dlq show --full and --json give
// it whole.
func TestDLQQuotesLongKeysBounded(t *testing.T) {
	e := newDLQEnv(t)
	big := strings.Repeat("k", 100_000)
	e.insert("big", "ident", "accounts", 0, 20, big, e.good, nil, "rejected", "open",
		fmt.Sprintf("postgres refused the row of %q: index row requires 100064 bytes", big), time.Now())

	const bound = 3000
	for _, args := range [][]string{
		{"dlq", "list", "--error-class", "rejected"},
		{"dlq", "show", e.id("big")},
	} {
		out := e.mustRun(args...)
		if !strings.Contains(out, "kkkk… (100000 bytes)") {
			t.Errorf("%s does not quote the key's start and length:\n%.600s", strings.Join(args, " "), out)
		}
		for _, line := range strings.Split(out, "\n") {
			if len(line) > bound {
				t.Errorf("%s: line of %d bytes, over %d: %.300s…", strings.Join(args, " "), len(line), bound, line)
			}
		}
	}
	for _, args := range [][]string{
		{"dlq", "show", e.id("big"), "--full"},
		{"dlq", "show", e.id("big"), "--json"},
	} {
		if out := e.mustRun(args...); !strings.Contains(out, big) {
			t.Errorf("%s does not print the whole key", strings.Join(args, " "))
		}
	}
}
