package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/peterbourgon/ff/v3/ffcli"
)

// buildVersion is what the binary knows of its build.
type buildVersion struct {
	// Version is the module version ("(devel)" for a build from a
	// checkout rather than go install …@version).
	Version string `json:"version"`
	// Commit, CommitTime and Modified are the version control stamp of a
	// build from a checkout: the commit, its time, and whether the tree
	// had uncommitted changes.
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commit_time,omitempty"`
	Modified   bool   `json:"modified,omitempty"`
	GoVersion  string `json:"go_version"`
	Platform   string `json:"platform"`
}

func readBuild() buildVersion {
	v := buildVersion{Version: "(unknown)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Version = bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (v buildVersion) String() string {
	s := "projector " + v.Version
	if v.Commit != "" {
		s += ", commit " + v.Commit
		if v.Modified {
			s += " (modified)"
		}
		if v.CommitTime != "" {
			s += " of " + v.CommitTime
		}
	}
	return s + ", " + v.GoVersion + " " + v.Platform
}

func versionCommand(stdout, stderr io.Writer) *ffcli.Command {
	var asJSON bool
	return newCommand("version", "projector version [--json]",
		"Print the module version, the commit it was built from, and the Go version: what to quote in a bug report or compare across replicas.", stderr,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, "print a JSON object: version, commit, commit_time, modified, go_version, platform")
		},
		func(context.Context, []string) error {
			v := readBuild()
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			_, err := fmt.Fprintln(stdout, v)
			return err
		})
}
