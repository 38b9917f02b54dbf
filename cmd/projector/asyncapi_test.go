package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/schemas"
)

// asyncapiDocs are the committed contracts of the example projection
// files: examples/NAME.yaml's is docs/asyncapi/NAME.yaml.
const asyncapiDocs = "docs/asyncapi"

// TestAsyncAPIDocuments: the committed AsyncAPI documents of examples/
// are what projector asyncapi writes for them, with the schemas the
// examples describe in the registry; -update rewrites them.
func TestAsyncAPIDocuments(t *testing.T) {
	reg, cl := testenv.Registry(t)
	if _, err := demo.RegisterSchemas(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	if _, err := schemas.Register(t.Context(), cl, "customers-value", customerSchema); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(repoRoot, "examples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		var out, errs bytes.Buffer
		if err := Main(t.Context(), []string{"asyncapi", "--config", f, "--registry-url", reg.URL()}, &out, &errs); err != nil {
			t.Fatalf("asyncapi --config %s: %v\n%s", f, err, &errs)
		}
		path := asyncapiDocs + "/" + filepath.Base(f)
		if !*update {
			if got, err := os.ReadFile(filepath.Join(repoRoot, path)); err == nil && !bytes.Equal(got, out.Bytes()) {
				t.Fatalf("%s is not what projector asyncapi writes for %s; regenerate it with: go test ./cmd/projector -run TestAsyncAPIDocuments -update\n%s",
					path, f, firstDifference(string(got), out.String()))
			}
		}
		checkGenerated(t, path, out.String())
	}
}

// TestAsyncAPIParserValidates: the AsyncAPI parser, with the Avro schema
// parser for the payloads, finds no error in the committed documents.
// It needs node and the validator's packages (npm ci --prefix
// scripts/asyncapi-validate), which CI installs.
func TestAsyncAPIParserValidates(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH: the AsyncAPI documents in docs/asyncapi are not validated by the AsyncAPI parser")
	}
	dir := filepath.Join(repoRoot, "scripts", "asyncapi-validate")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@asyncapi", "parser")); err != nil {
		t.Skip("the validator's packages are not installed (npm ci --prefix scripts/asyncapi-validate --ignore-scripts): the AsyncAPI documents in docs/asyncapi are not validated by the AsyncAPI parser")
	}
	docs, err := filepath.Glob(filepath.Join(repoRoot, asyncapiDocs, "*.yaml"))
	if err != nil || len(docs) < 3 {
		t.Fatalf("%s: %v %v", asyncapiDocs, docs, err)
	}
	out, err := exec.CommandContext(t.Context(), node, append([]string{filepath.Join(dir, "validate.mjs")}, docs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("validate.mjs: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), ": valid AsyncAPI 3.0.0"); n != len(docs) {
		t.Errorf("validate.mjs said %d documents valid, want %d:\n%s", n, len(docs), out)
	}

	// A document the parser refuses fails the script, which names the
	// problem: the check can fail.
	good, err := os.ReadFile(docs[0])
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, bytes.Replace(good, []byte("schemaIdLocation: payload"), []byte("schemaIdLocation: body"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.CommandContext(t.Context(), node, filepath.Join(dir, "validate.mjs"), bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "schemaIdLocation") {
		t.Errorf("validate.mjs passed a document with schemaIdLocation: body (%v):\n%s", err, out)
	}
}

// TestAsyncAPICommand: the command writes to --output or stdout, in YAML
// or JSON, and refuses, before writing anything, a projection whose
// reader schema it cannot have and a format it does not write.
func TestAsyncAPICommand(t *testing.T) {
	saga := filepath.Join(repoRoot, "examples", "saga.yaml")
	dir := t.TempDir()

	out := filepath.Join(dir, "contract.json")
	var stdout, stderr bytes.Buffer
	if err := Main(t.Context(), []string{"asyncapi", "--config", saga, "--identity", "order-sagas", "--format", "json", "--output", out}, &stdout, &stderr); err != nil {
		t.Fatalf("asyncapi: %v\n%s", err, &stderr)
	}
	if stdout.Len() > 0 {
		t.Errorf("with --output, stdout got %q", stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		AsyncAPI   string `json:"asyncapi"`
		Operations map[string]struct {
			Bindings struct {
				Kafka struct {
					GroupID struct {
						Enum []string `json:"enum"`
					} `json:"groupId"`
				} `json:"kafka"`
			} `json:"bindings"`
		} `json:"operations"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("--format json wrote no JSON: %v", err)
	}
	if g := doc.Operations["order_sagas"].Bindings.Kafka.GroupID.Enum; doc.AsyncAPI != "3.0.0" || len(g) != 1 || g[0] != "order-sagas" {
		t.Errorf("document %s, group %v; want AsyncAPI 3.0.0 with group order-sagas", doc.AsyncAPI, g)
	}

	// The default identity is run's.
	stdout.Reset()
	if err := Main(t.Context(), []string{"asyncapi", "--config", saga}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "enum:\n            - projector\n") {
		t.Errorf("without --identity the group is not projector:\n%s", stdout.String())
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", filepath.Join(repoRoot, "examples", "projections.yaml")}, `--registry-url (PROJECTOR_REGISTRY_URL) is required: projection "accounts" has no schema: file`},
		{[]string{"--config", saga, "--format", "xml"}, `--format "xml": want yaml or json`},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "--config"},
	} {
		target := filepath.Join(dir, "refused.yaml")
		stdout.Reset()
		err := Main(t.Context(), append(append([]string{"asyncapi"}, c.args...), "--output", target), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("asyncapi %v: %v, want %q", c.args, err, c.want)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("asyncapi %v wrote --output though it failed", c.args)
		}
	}
}
