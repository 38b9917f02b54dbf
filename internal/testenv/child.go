package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/projector-dev/projector/internal/stopsignal"
)

// childEnv carries the arguments of a child process started from a test
// binary (see ChildCommand): its TestMain runs the command with them
// instead of the tests.
const childEnv = "PROJECTOR_TEST_CHILD_ARGS"

// Main is a command's entry point as its tests call it.
type Main func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// RunTests is a TestMain that lets a test start the test binary as the
// command (name, run by main): with the child's arguments set it runs
// them, until SIGTERM, SIGHUP or an interrupt ends its context, and exits with
// their outcome; otherwise it runs the tests.
func RunTests(m *testing.M, name string, main Main) {
	if raw := os.Getenv(childEnv); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, "bad child args:", err)
			os.Exit(2)
		}
		ctx, stop := stopsignal.Context(context.Background())
		err := main(ctx, args, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, name+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ChildCommand is the command that runs the test binary as the command
// with args (see RunTests).
func ChildCommand(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	return cmd
}
