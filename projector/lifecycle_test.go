package projector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/internal/testenv"
	"github.com/projector-dev/projector/projection"
	"github.com/projector-dev/projector/projector"
	"github.com/projector-dev/projector/sinks/postgres"
)

// engineGoroutines lists the running goroutines that are an engine's: a
// Kafka client's, a worker's, the engine's own or its publisher's.
func engineGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, mark := range []string{"franz-go/pkg/kgo.", "projector/projector.(*Engine)", "projector/partition.", "projector/dlqpublish."} {
			if strings.Contains(g, mark) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// settled waits until no goroutine of an engine runs.
func settled(t *testing.T, what string) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, func() error {
		if gs := engineGoroutines(); len(gs) > 0 {
			return fmt.Errorf("%s: %d engine goroutines still run, the first:\n%s", what, len(gs), gs[0])
		}
		return nil
	})
}

// An engine that is built and stopped without running starts nothing and
// leaves nothing behind, however often it is stopped.
func TestNewConnectsToNothing(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 50
	b := setup(t, opts, 2)
	settled(t, "before New")
	e := b.engine(t, "never-run", projector.Config{})
	settled(t, "after New")
	if e.Client() != nil {
		t.Error("Client before Run: want nil, the engine has no client yet")
	}
	if err := e.Ready(t.Context())["group"]; err == nil {
		t.Error("Ready before Run: the group check passes")
	}
	for i := range 2 {
		if err := e.Stop(t.Context()); err != nil {
			t.Fatalf("Stop %d of an engine never run: %v", i+1, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := e.Run(ctx); err != nil {
		t.Fatalf("Run after Stop: %v, want it to return at once without error", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run after Stop ran until its context ended")
	}
	settled(t, "after Stop")
}

// Stop ends Run within its bound, a second Stop is a no-op, a second
// Run is refused, and every goroutine Run started has ended.
func TestStopEndsRun(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 200
	b := setup(t, opts, 2)
	settled(t, "before New")
	e := b.engine(t, "stop", projector.Config{ShutdownTimeout: 5 * time.Second})
	ran := make(chan error, 1)
	go func() { ran <- e.Run(context.WithoutCancel(t.Context())) }()
	b.verify(t, "stop")

	stopCtx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := e.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// Stop returns once Run's last step is done; Run's return reaches
	// this goroutine just after.
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop returned, and Run has not within 5s")
	}
	if err := e.Stop(stopCtx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := e.Run(t.Context()); !errors.Is(err, projector.ErrRunTwice) {
		t.Fatalf("second Run: %v, want ErrRunTwice", err)
	}
	if e.Client() == nil {
		t.Error("Client after Run: nil")
	}
	settled(t, "after Stop")
	b.verify(t, "stop") // nothing moved after the stop
}

// A projection defined in Go that leaves its key column, version field,
// mode and on_gap at their zero values runs with the registry's decoders
// and ends equal to the reference fold, as the file it mirrors does.
func TestGoProjectionWithDefaults(t *testing.T) {
	opts := demo.DefaultOptions()
	opts.Aggregates = 300
	b := setup(t, opts, 2)
	parsed := b.projs[0] // migrated: its columns carry Postgres's type names
	goFold := &projection.Projection{
		Name: parsed.Name, Topic: parsed.Topic, Table: parsed.Table,
		KeyField: parsed.KeyField, TypeField: parsed.TypeField,
		Columns: parsed.Columns,
		Fold:    parsed.Compiled(),
	}
	decoders, err := projector.RegistryDecoders(t.Context(), b.reg, goFold)
	if err != nil {
		t.Fatal(err)
	}
	e, err := projector.New(projector.Config{
		Brokers: b.kafka.Addrs(), Identity: "go-defaults",
		Projections: []*projection.Projection{goFold},
		Store:       postgres.NewStore(b.db.Pool),
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, decoders)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e)
	b.verify(t, "go-defaults")
}
