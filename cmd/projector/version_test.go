package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestVersion builds the command from this checkout (stamped with its
// version control state whatever GOFLAGS says) and asks it its
// version: it names the commit the checkout is at (modified when the tree
// has uncommitted changes) and the Go version, in text and in JSON.
func TestVersion(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "projector")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("projector version --json: %v", err)
	}
	var v buildVersion
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	if v.Commit != strings.TrimSpace(string(head)) || v.GoVersion != runtime.Version() || v.Version == "" || v.CommitTime == "" {
		t.Errorf("version --json: %+v, want commit %s and %s", v, head, runtime.Version())
	}
	text, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(text, []byte("projector ")) || !bytes.Contains(text, []byte(v.Commit)) || !bytes.Contains(text, []byte(runtime.Version())) {
		t.Errorf("version: %q", text)
	}
}
