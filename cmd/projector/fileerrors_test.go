package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/projector-dev/projector/internal/demo"
)

// TestSchemaFileErrorsNeverQuoteIt: produce --schema and check
// --schema-file pointed at a file that is not an Avro schema (a passwd
// file, a password file, a JSON file with a password in it) refuse it
// with the file's name, a line and column and what was wanted, and print
// no line of it.
func TestSchemaFileErrorsNeverQuoteIt(t *testing.T) {
	const pass = "S3cret"
	dir := t.TempDir()
	events := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(events, []byte(`{"id": "a"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := map[string]struct{ text, at string }{
		"passwd":      {"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n", "line 1, column 1"},
		"pgpass":      {"db.example:5432:app:app:" + pass + "\n", "line 1, column 1"},
		"app.conf":    {"# database\npassword=" + pass + "\n", "line 1, column 1"},
		"config.json": {"{\"user\": \"app\",\n \"password\": " + pass + "}\n", "line 2, column 14"},
		"secret.avsc": {`"` + pass + `"`, "line 1, column 1"},
	}
	pos := regexp.MustCompile(`line \d+, column \d+`)
	for name, f := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(f.text), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"produce", "--registry-url", "http://127.0.0.1:1", "--topic", "t", "--key", "k", "--file", events, "--schema", path},
			{"check", "--config", "../../examples/saga.yaml", "--no-database", "--schema-file", path},
		} {
			t.Run(args[0]+" "+name, func(t *testing.T) {
				out, err := runCaptured(t.Context(), args...)
				if err == nil {
					t.Fatalf("%s accepted %s:\n%s", args[0], name, out)
				}
				msg := err.Error()
				if !strings.Contains(msg, path) || !pos.MatchString(msg) || !strings.Contains(msg, "want an Avro schema") {
					t.Errorf("the error does not name the file, a line and column and what was wanted: %s", msg)
				}
				if !strings.Contains(msg, f.at) {
					t.Errorf("the error does not point at %s: %s", f.at, msg)
				}
				if strings.Contains(out, pass) {
					t.Errorf("the output prints the file's password:\n%s", out)
				}
				for _, line := range strings.Split(f.text, "\n") {
					if len(line) > 3 && strings.Contains(out, line) {
						t.Errorf("the output quotes the file's line %q:\n%s", line, out)
					}
				}
			})
		}
	}
}

// TestConfigFileErrorsNeverQuoteIt: check --config (as every command that
// loads the projection file) pointed at a file that is not a projection
// file, or at one with a 10 MB name, fails in a short error that names
// the file and a line and column, and quotes no line of it.
func TestConfigFileErrorsNeverQuoteIt(t *testing.T) {
	const pass = "S3cret"
	dir := t.TempDir()
	long := strings.Repeat("x", 10<<20)
	for name, text := range map[string]string{
		"passwd":    "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n",
		"pgpass":    "db.example:5432:app:app:" + pass + "\n",
		"long name": "projections:\n  - name: " + long + "\n    topic: t\n    mode: fold\n",
		"long key":  "projections:\n  - name: p\n    ? " + long + "\n    : " + pass + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := runCaptured(t.Context(), "check", "--no-database", "--config", path)
			if err == nil {
				t.Fatalf("check accepted %s:\n%.300s", name, out)
			}
			if len(out) > 1000 {
				t.Fatalf("check printed %d bytes: %.300s…", len(out), out)
			}
			if !strings.Contains(out, path) || !regexp.MustCompile(`line \d+, column \d+`).MatchString(out) {
				t.Errorf("the error does not name the file and a line and column:\n%s", out)
			}
			if strings.Contains(out, pass) {
				t.Errorf("the output prints the file's password:\n%s", out)
			}
			for _, line := range strings.Split(text, "\n") {
				if len(line) > 7 && !strings.HasPrefix(line, "projections:") && strings.Contains(out, line[:7]) {
					t.Errorf("the output quotes the file's line %.40q:\n%s", line, out)
				}
			}
		})
	}
}

// TestProduceLongFieldShortError: an events line with a 10 MB field name
// fails produce in an error of a few hundred bytes that names the line,
// and the file when it comes from one.
func TestProduceLongFieldShortError(t *testing.T) {
	e := newProduceEnv(t, demo.Topic, 1)
	avsc := filepath.Join("..", "..", "internal", "demo", "account_event.avsc")
	line := `{"account_id": "a", "version": 1, "type": "AccountOpened", "` + strings.Repeat("f", 10<<20) + `": 1, "occurred_at": 0}` + "\n"
	_, err := e.produce(strings.NewReader(line), "--schema", avsc, "--key-field", "account_id")
	if err == nil {
		t.Fatal("produced a line with an unknown field")
	}
	if len(err.Error()) > 1000 || !strings.HasPrefix(err.Error(), "line 1: field ") {
		t.Errorf("error of %d bytes: %.300s", len(err.Error()), err)
	}
	// Read from a file, the error names it.
	file := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(file, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = e.produce(strings.NewReader(""), "--schema", avsc, "--key-field", "account_id", "--file", file)
	if err == nil || len(err.Error()) > 1000 || !strings.HasPrefix(err.Error(), file+": line 1: field ") {
		t.Errorf("error of %d bytes: %.300s", len(fmt.Sprint(err)), err)
	}
}

// TestPEMFileErrorsNeverQuoteIt: the TLS file flags pointed at a file
// that holds no PEM block (a password file) name the flag and the file,
// and print nothing of it.
func TestPEMFileErrorsNeverQuoteIt(t *testing.T) {
	const pass = "S3cret"
	dir := t.TempDir()
	pgpass := filepath.Join(dir, "pgpass")
	events := filepath.Join(dir, "events.jsonl")
	for path, text := range map[string]string{pgpass: "db.example:5432:app:app:" + pass + "\n", events: "{}\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, flags := range [][]string{
		{"--kafka-tls-ca-file", pgpass},
		{"--kafka-tls-cert-file", pgpass, "--kafka-tls-key-file", pgpass},
		{"--registry-tls-ca-file", pgpass},
	} {
		t.Run(flags[0], func(t *testing.T) {
			args := append([]string{"produce", "--topic", "t", "--key", "k", "--file", events, "--registry-url", "https://127.0.0.1:1"}, flags...)
			out, err := runCaptured(t.Context(), args...)
			if err == nil {
				t.Fatalf("produce accepted %s:\n%s", flags[0], out)
			}
			if !strings.Contains(err.Error(), flags[0]+" "+pgpass) {
				t.Errorf("the error does not name the flag and the file: %v", err)
			}
			if strings.Contains(out, pass) || strings.Contains(out, "db.example") {
				t.Errorf("the output quotes the file:\n%s", out)
			}
		})
	}
}
