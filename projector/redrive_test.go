package projector_test

import (
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/deadletters"
	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projector"
)

// withSchemaID is the wire-format value v (a magic byte, then the schema
// id) naming schema id instead.
func withSchemaID(v []byte, id uint32) []byte {
	out := slices.Clone(v)
	binary.BigEndian.PutUint32(out[1:5], id)
	return out
}

// redriveFixture produces a demo stream of which one aggregate's version
// 2 names a schema id the registry does not know yet (its later versions
// park behind it), then a copy of an applied version 1 with other
// content under that id (stale once decodable), and a value no decoder
// reads; the engine dead-letters the three.
type redriveFixture struct {
	*faultBundle
	unknownID                 uint32
	gapKey, staleKey, junkKey string
	records                   []demo.Record // the stream the table must equal the fold of
}

func newRedriveFixture(t *testing.T) *redriveFixture {
	t.Helper()
	ctx := t.Context()
	f := &redriveFixture{faultBundle: faultSetup(t, demo.Options{Aggregates: 6, MeanEvents: 4, Seed: 3}, 1), unknownID: 901}
	if f.fake == nil {
		t.Skip("needs the fake schema registry, to register a schema id on cue")
	}
	f.records = f.faultBundle.records
	gap, stale := -1, -1
	for i, r := range f.records {
		switch {
		case r.Poison != "" || r.Tombstone:
		case gap < 0 && r.Event.Version == 2:
			gap = i
		case stale < 0 && r.Event.Version == 1 && gap >= 0 && r.Key != f.records[gap].Key:
			stale = i
		}
	}
	if gap < 0 || stale < 0 {
		t.Fatal("the demo stream has no version 2 or no other aggregate's version 1")
	}
	f.gapKey, f.staleKey, f.junkKey = f.records[gap].Key, f.records[stale].Key, "junk-1"
	cl := f.kafkaClient(t)
	produce := func(recs []demo.Record) {
		if err := demo.Produce(ctx, cl, f.enc, recs, nil); err != nil {
			t.Fatal(err)
		}
	}
	poisoned := func(r demo.Record) *kgo.Record {
		v, err := f.enc.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: f.kafka.Topic, Key: []byte(r.Key), Value: withSchemaID(v, f.unknownID)}
	}
	produce(f.records[:gap])
	if err := cl.ProduceSync(ctx, poisoned(f.records[gap])).FirstErr(); err != nil {
		t.Fatal(err)
	}
	produce(f.records[gap+1:])
	other := f.records[stale]
	other.Event.Owner = "someone else"
	other.Event.Amount += 1000
	if err := cl.ProduceSync(ctx, poisoned(other),
		&kgo.Record{Topic: f.kafka.Topic, Key: []byte(f.junkKey), Value: []byte("junk")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.end, err = demo.EndOffsets(ctx, kadm.NewClient(cl), f.kafka.Topic); err != nil {
		t.Fatal(err)
	}
	return f
}

// engine runs the fixture's engine, looking at the redrive queue every
// 20ms.
func (f *redriveFixture) engine(t *testing.T, identity string) prometheus.Gatherer {
	t.Helper()
	cfg := fastRetry
	cfg.MaxAttempts = 2
	reg := prometheus.NewRegistry()
	run(t, f.faultBundle.engine(t, identity, projector.Config{Partition: cfg, RedriveInterval: 20 * time.Millisecond, Registerer: reg}))
	return reg
}

// deadLetters waits for the fixture's three dead letters and returns
// them by key.
func (f *redriveFixture) deadLetters(t *testing.T, identity string) map[string]deadletters.Entry {
	t.Helper()
	var dls []deadletters.Entry
	testenv.WaitFor(t, 60*time.Second, testenv.Holds("three dead letters", func() bool {
		var err error
		dls, err = deadletters.List(t.Context(), f.db.Pool, deadletters.Filter{Identity: identity})
		return err == nil && len(dls) == 3
	}))
	byKey := map[string]deadletters.Entry{}
	for _, d := range dls {
		byKey[d.Key] = d
	}
	return byKey
}

// registerUnknown registers the schema the poisoned values name.
func (f *redriveFixture) registerUnknown(t *testing.T) {
	t.Helper()
	s, err := f.reg.SchemaByVersion(t.Context(), f.kafka.Topic+"-value", 1)
	if err != nil {
		t.Fatal(err)
	}
	f.fake.SeedSchema(f.kafka.Topic+"-value", 98, int(f.unknownID), s.Schema)
}

func (f *redriveFixture) topicEnd(t *testing.T) map[int32]int64 {
	t.Helper()
	end, err := demo.EndOffsets(t.Context(), kadm.NewClient(f.kafkaClient(t)), f.kafka.Topic)
	if err != nil {
		t.Fatal(err)
	}
	return end
}

// TestRedriveThroughOwningWorker fixes the registry under three dead
// letters and redrives them: the owning worker applies them through the
// version gate in its own transaction, publishing nothing. The missing
// version 2 applies and unblocks its parked successors (the table then
// equals the reference fold), the stale copy resolves its dead letter
// without overwriting the row, and the undecodable value reopens its
// entry with one attempt more; the queue empties and the audit log holds
// the request and its application, with the requester's users.
func TestRedriveThroughOwningWorker(t *testing.T) {
	ctx := t.Context()
	f := newRedriveFixture(t)
	f.engine(t, "redrive")
	byKey := f.deadLetters(t, "redrive")
	gap, stale, junk := byKey[f.gapKey], byKey[f.staleKey], byKey[f.junkKey]
	if gap.ID == 0 || stale.ID == 0 || junk.ID == 0 {
		t.Fatalf("dead letters by key %v: want %s, %s and %s", byKey, f.gapKey, f.staleKey, f.junkKey)
	}
	before := f.topicEnd(t)
	f.registerUnknown(t)

	who := deadletters.Actor{Name: "ticket-42", OSUser: "alice"}
	queued, err := deadletters.Redrive(ctx, f.db.Pool, []int64{gap.ID, stale.ID, junk.ID}, who, deadletters.Filter{IDs: []int64{gap.ID, stale.ID, junk.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(queued) != 3 {
		t.Fatalf("queued %d dead letters, want 3", len(queued))
	}
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("the redrives to be applied", func() bool {
		var n int
		if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM projector_redrives`).Scan(&n); err != nil || n > 0 {
			return false
		}
		g, err1 := deadletters.Get(ctx, f.db.Pool, gap.ID)
		s, err2 := deadletters.Get(ctx, f.db.Pool, stale.ID)
		j, err3 := deadletters.Get(ctx, f.db.Pool, junk.ID)
		return err1 == nil && err2 == nil && err3 == nil &&
			g.Status == deadletters.StatusResolved && s.Status == deadletters.StatusResolved &&
			j.Status == deadletters.StatusOpen && j.Attempts == junk.Attempts+1
	}))
	// The table is the fold of the stream without the stale copy, which
	// must not have overwritten its row.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := demo.WaitCommitted(wctx, f.db.Pool, "redrive", f.kafka.Topic, f.end, nil); err != nil {
		t.Fatal(err)
	}
	if err := demo.Verify(wctx, f.db.Pool, demo.Table, demo.Fold(f.records)); err != nil {
		t.Fatal(err)
	}
	var parked, dls int
	if err := f.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_parked), (SELECT count(*) FROM projector_dead_letters)`).Scan(&parked, &dls); err != nil {
		t.Fatal(err)
	}
	if parked != 0 || dls != 3 {
		t.Errorf("%d parked events and %d dead letters, want 0 and still 3 (a failed redrive reopens its entry)", parked, dls)
	}
	if after := f.topicEnd(t); !mapsEqual(before, after) {
		t.Errorf("the source topic's end moved from %v to %v: a redrive must publish nothing", before, after)
	}

	audit, err := deadletters.ListAudit(ctx, f.db.Pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	var request, applied *deadletters.AuditEntry
	for i := range audit {
		switch audit[i].Action {
		case deadletters.AuditRedrive:
			request = &audit[i]
		case deadletters.AuditRedriven:
			applied = &audit[i]
		}
	}
	if request == nil || applied == nil {
		t.Fatalf("audit %+v: want a redrive and a redriven entry", audit)
	}
	for _, a := range []*deadletters.AuditEntry{request, applied} {
		if a.Actor != who.Name || a.OSUser != who.OSUser || a.DBUser != "postgres" || len(a.EntryIDs) != 3 {
			t.Errorf("audit %s: actor %q, os user %q, db user %q, %d entries; want %q, %q, postgres, 3",
				a.Action, a.Actor, a.OSUser, a.DBUser, len(a.EntryIDs), who.Name, who.OSUser)
		}
	}
	if !strings.Contains(applied.Detail, "resolved") || !strings.Contains(applied.Detail, "open") {
		t.Errorf("redriven audit detail %q: want each dead letter's outcome", applied.Detail)
	}
}

// TestRedriveFencedWorkerAppliesNothing queues a redrive for a partition
// whose worker a newer owner has fenced: the worker's redrive
// transaction fails its epoch check and commits nothing, so the dead
// letter stays queued (dlq list shows it) with its queue row, the row
// keeps its version, and no application is audited.
func TestRedriveFencedWorkerAppliesNothing(t *testing.T) {
	ctx := t.Context()
	f := newRedriveFixture(t)
	reg := f.engine(t, "fenced")
	gap := f.deadLetters(t, "fenced")[f.gapKey]
	f.registerUnknown(t)
	var version int64
	if err := f.db.Pool.QueryRow(ctx, `SELECT version FROM accounts WHERE account_id = $1`, f.gapKey).Scan(&version); err != nil {
		t.Fatal(err)
	}
	// A newer owner claims the partition behind the worker's back.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE projector_offsets SET owner_epoch = owner_epoch + 1 WHERE identity = 'fenced'`); err != nil {
		t.Fatal(err)
	}
	if _, err := deadletters.Redrive(ctx, f.db.Pool, []int64{gap.ID}, deadletters.Actor{Name: "ops"}, nil); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, testenv.Holds("the worker to be fenced", func() bool {
		return counter(t, reg, "projector_fenced_batches_total") >= 1
	}))
	g, err := deadletters.Get(ctx, f.db.Pool, gap.ID)
	if err != nil {
		t.Fatal(err)
	}
	var queued, applied int
	var now int64
	if err := f.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM projector_redrives),
		(SELECT count(*) FROM projector_dlq_audit WHERE action = 'redriven'),
		(SELECT version FROM accounts WHERE account_id = $1)`, f.gapKey).Scan(&queued, &applied, &now); err != nil {
		t.Fatal(err)
	}
	if g.Status != deadletters.StatusQueued || queued != 1 || applied != 0 || now != version {
		t.Errorf("after the fenced worker's attempt: status %q, %d queued, %d applications audited, %s at v%d; want queued, 1, 0, v%d",
			g.Status, queued, applied, f.gapKey, now, version)
	}
}

func mapsEqual(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
