package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestConfigPrint prints run's effective configuration from its command
// line, an environment variable and the defaults: each flag says where
// its value came from, and no secret is shown, whether given as a flag,
// in a URL or by a variable.
func TestConfigPrint(t *testing.T) {
	t.Setenv("PROJECTOR_BATCH_MAX_RECORDS", "77")
	t.Setenv("PROJECTOR_REGISTRY_PASSWORD", "S3cretReg")
	args := []string{"config", "print", "--json", "run", "--brokers", "b:9092",
		"--database-url", "postgres://app:S3cretDB@db:5432/app", "--kafka-sasl-mechanism", "plain",
		"--kafka-sasl-username", "svc", "--kafka-sasl-password", "S3cretSASL"}
	var out, errOut bytes.Buffer
	if err := Main(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("config print: %v\n%s", err, &errOut)
	}
	if strings.Contains(out.String()+errOut.String(), "S3cret") {
		t.Fatalf("config print shows a secret:\n%s%s", &out, &errOut)
	}
	var settings []setting
	if err := json.Unmarshal(out.Bytes(), &settings); err != nil {
		t.Fatalf("config print --json: %v\n%s", err, &out)
	}
	got := map[string]setting{}
	for _, s := range settings {
		got[s.Flag] = s
	}
	for flag, want := range map[string]setting{
		"brokers":              {Value: "b:9092", Source: "command line"},
		"database-url":         {Value: "postgres://app:xxxxx@db:5432/app", Source: "command line"},
		"batch-max-records":    {Value: "77", Source: "environment", Env: "PROJECTOR_BATCH_MAX_RECORDS"},
		"registry-password":    {Value: "(set, hidden)", Source: "environment", Env: "PROJECTOR_REGISTRY_PASSWORD"},
		"kafka-sasl-password":  {Value: "(set, hidden)", Source: "command line"},
		"kafka-sasl-username":  {Value: "svc", Source: "command line"},
		"rebuild-lock-timeout": {Value: "100ms", Source: "default"},
		"identity":             {Value: "projector", Source: "default"},
	} {
		want.Flag = flag
		if got[flag] != want {
			t.Errorf("--%s: %+v, want %+v", flag, got[flag], want)
		}
	}
	if _, ok := got["execute"]; ok {
		t.Error("run has no --execute; config print shows another command's flags")
	}

	// The text form, of another command.
	out.Reset()
	if err := Main(t.Context(), []string{"config", "print", "relay", "--batch-size", "9"}, &out, &errOut); err != nil {
		t.Fatalf("config print relay: %v\n%s", err, &errOut)
	}
	if !strings.HasPrefix(out.String(), "# projector relay:") || !strings.Contains(out.String(), "--batch-size=9") {
		t.Errorf("config print relay:\n%s", &out)
	}
	for _, bad := range [][]string{{"config", "print", "nope"}, {"config", "print", "dlq"}, {"config", "print", "run", "--no-such-flag"}} {
		if err := Main(t.Context(), bad, &out, &errOut); err == nil || exitCode(err) != 2 {
			t.Errorf("%v: %v (exit %d), want a usage error", bad, err, exitCode(err))
		}
	}
}
