package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/adminapi"
	"github.com/projector-dev/projector/auth"
	"github.com/projector-dev/projector/sinks/postgres"
)

// principal authenticates every request as one principal.
type principal auth.Principal

func (p principal) Authenticate(*http.Request) (auth.Principal, error) { return auth.Principal(p), nil }

// TestAdminAPIOffsetReset resets stored offsets over the admin API as
// run --api serves it, against a broker: a dry run moves nothing, a reset
// moves the partition named and audits it with the subject in its
// transaction, a partition the topic lacks is a 400 naming partitions,
// and a reset whose audit row fails moves nothing.
func TestAdminAPIOffsetReset(t *testing.T) {
	e := newOffsetsEnv(t, 2)
	e.produce(0, "a-", 0, 10, nil)
	e.produce(1, "b-", 0, 10, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	offsets := postgres.NewOffsets(e.db.Pool, e.identity)
	h, err := adminapi.Handler(adminapi.Config{
		DB: e.db.Pool, Identity: e.identity, Authenticator: principal{Subject: "deploy-bot", Scopes: []string{auth.ScopeAdmin}},
		Offsets: offsetResetter{adm: kadm.NewClient(cl), offsets: offsets, group: e.identity},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/admin/v1/offsets/resets", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, m
	}
	topic := e.kafka.Topic
	code, body := post(fmt.Sprintf(`{"topic":%q,"partitions":[0],"to_offset":4,"dry_run":true}`, topic))
	if code != 200 || body["dry_run"] != true || fmt.Sprint(body["partitions"].([]any)[0].(map[string]any)["new_offset"]) != "4" {
		t.Fatalf("dry run: %d %v", code, body)
	}
	if next, _ := e.stored(0); next != nil {
		t.Fatalf("a dry run stored offset %d", *next)
	}
	code, body = post(fmt.Sprintf(`{"topic":%q,"partitions":[0],"to_offset":4}`, topic))
	if code != 200 || len(body["partitions"].([]any)) != 1 {
		t.Fatalf("reset: %d %v", code, body)
	}
	if next, epoch := e.stored(0); orDash(next) != "4" || epoch < 1 {
		t.Errorf("partition 0 after the reset: offset %s epoch %d, want 4", orDash(next), epoch)
	}
	resets, err := offsets.ListResets(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 1 || resets[0].Actor != "deploy-bot" || resets[0].Partition != 0 || resets[0].NewOffset != 4 ||
		resets[0].OSUser != "" || resets[0].DBUser == "" || resets[0].Detail != "--to-offset 4 (admin API)" {
		t.Errorf("audit: %+v, want one reset of partition 0 to 4 by deploy-bot", resets)
	}
	if code, body := post(fmt.Sprintf(`{"topic":%q,"partitions":[7],"to":"earliest"}`, topic)); code != 400 || !strings.HasPrefix(fmt.Sprint(body["detail"]), "partitions: ") {
		t.Errorf("a partition the topic lacks: %d %v, want 400 naming partitions", code, body)
	}
	if _, err := e.db.Pool.Exec(t.Context(), `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
		CREATE TRIGGER refuse BEFORE INSERT ON projector_offsets_audit FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	if code, body := post(fmt.Sprintf(`{"topic":%q,"partitions":[0],"to":"latest"}`, topic)); code != 500 {
		t.Errorf("a reset whose audit fails: %d %v, want 500", code, body)
	}
	if next, _ := e.stored(0); orDash(next) != "4" {
		t.Errorf("partition 0 after a reset whose audit failed: %s, want still 4", orDash(next))
	}
}
