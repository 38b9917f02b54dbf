package main

import (
	"bytes"
	"errors"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The production binary links the product, not the consumers the
// benchmark measures it against: their Kafka clients (Sarama, Watermill)
// and Sarama's Kerberos stack would ship in every image otherwise.
func TestBinaryLinksNoBenchmarkPeers(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the binary's packages")
	}
	out, err := exec.CommandContext(t.Context(), gobin, "list", "-deps", ".").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/IBM/sarama", "github.com/ThreeDotsLabs/watermill", "github.com/jcmturner/gokrb5", "github.com/projector-dev/projector/internal/bench"} {
			if pkg == banned || strings.HasPrefix(pkg, banned+"/") {
				t.Errorf("projector links %s", pkg)
			}
		}
	}
}

// The embedded broker and registry are for the commands that run without
// a Kafka of their own (demo, dev): no other command of the binary reaches
// them, directly or through the package that runs them.
func TestEmbeddedBrokerOnlyBehindDemo(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "demo.go" || name == "dev.go" {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasSuffix(path, "/kfake") || strings.HasSuffix(path, "/srfake") || strings.HasSuffix(path, "/internal/embedded") {
				t.Errorf("%s imports %s: only demo and dev run on an embedded broker and registry", name, path)
			}
		}
	}
}

// projector bench, whatever its flags, says where the benchmark went.
func TestBenchSaysWhereItWent(t *testing.T) {
	var out bytes.Buffer
	for _, args := range [][]string{{"bench"}, {"bench", "--events", "1000", "--modes", "engine-fold"}} {
		err := Main(t.Context(), args, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "projector-bench") || !strings.Contains(err.Error(), "make bench") {
			t.Errorf("projector %s: %v, want an error naming projector-bench and make bench", strings.Join(args, " "), err)
		}
	}
}
