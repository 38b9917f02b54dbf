package main

import (
	"slices"
	"strings"
	"testing"
)

// TestURLFlagWithoutScheme: a --registry-url or --database-url whose
// scheme was left out (user:password@host) is refused before the command
// does anything, by an error that names the flag, and the password is
// printed nowhere, whichever command is given it.
func TestURLFlagWithoutScheme(t *testing.T) {
	const pass = "S3cret"
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"check", "--config", "../../examples/saga.yaml", "--no-database", "--registry-url", "user:" + pass + "@127.0.0.1:1"}, "--registry-url"},
		{[]string{"run", "--brokers", "127.0.0.1:1", "--registry-url", "user:" + pass + "@127.0.0.1:1"}, "--registry-url"},
		{[]string{"produce", "--topic", "t", "--key", "k", "--registry-url", "user:" + pass + "@127.0.0.1:1/"}, "--registry-url"},
		{[]string{"dlq", "show", "--registry-url", "user:" + pass + "@127.0.0.1:1", "1"}, "--registry-url"},
		{[]string{"check", "--config", "../../examples/saga.yaml", "--database-url", "app:" + pass + "@127.0.0.1:1/test"}, "--database-url"},
		{[]string{"status", "--database-url", "app:" + pass + "@127.0.0.1:1/test"}, "--database-url"},
		// From the environment, as a deployment gives it.
		{[]string{"check", "--config", "../../examples/saga.yaml", "--no-database"}, "--registry-url"},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			if !slices.Contains(tc.args, tc.flag) {
				t.Setenv("PROJECTOR_REGISTRY_URL", "user:"+pass+"@127.0.0.1:1")
			}
			out, err := runCaptured(t.Context(), tc.args...)
			if err == nil {
				t.Fatalf("projector %s succeeded:\n%s", strings.Join(tc.args, " "), out)
			}
			if strings.Contains(out, pass) {
				t.Errorf("the output prints the password:\n%s", out)
			}
			if !strings.Contains(err.Error(), tc.flag+" ") || !strings.Contains(err.Error(), "has no scheme") {
				t.Errorf("the error does not say that %s has no scheme: %v", tc.flag, err)
			}
		})
	}
}
