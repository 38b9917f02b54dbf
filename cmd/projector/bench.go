package main

import (
	"context"
	"errors"

	"github.com/peterbourgon/ff/v3/ffcli"
)

// errBenchMoved answers `projector bench`: the benchmark is a command of
// its own, so that this binary does not link the consumers it is measured
// against.
var errBenchMoved = errors.New("the benchmark moved to its own command: projector-bench (go run ./cmd/projector-bench, or make bench), with the same flags")

// benchMovedCommand keeps bench in the list of subcommands, saying where
// it went.
func benchMovedCommand() *ffcli.Command {
	return &ffcli.Command{
		Name:       "bench",
		ShortUsage: "projector-bench [flags]",
		ShortHelp:  "Moved: the benchmark is the command projector-bench (make bench).",
		Exec:       func(context.Context, []string) error { return errBenchMoved },
	}
}

// benchMoved reports whether args ask for the benchmark, whatever its
// flags: they are the new command's and would not parse here.
func benchMoved(args []string) bool { return len(args) > 0 && args[0] == "bench" }
