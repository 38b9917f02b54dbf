package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// The environment: every flag that has a variable reads it when the
// command line does not give the flag, and the command line wins.
//
//   - A variable has one meaning. It is PROJECTOR_ and the flag name in
//     upper case with _ for - (--database-url reads
//     PROJECTOR_DATABASE_URL), so that a deployment sets it once for every
//     command that takes the flag. Where a command's flag of the same name
//     means something else or has another default (relay's
//     --unready-after, produce's --topic), its variable carries the
//     command's name too: PROJECTOR_RELAY_UNREADY_AFTER,
//     PROJECTOR_PRODUCE_TOPIC. ownEnv lists those flags.
//   - A flag that confirms a destructive action has no variable: a
//     variable left in a shell or a deployment would turn a dry run into a
//     real one. Such a variable is ignored, and said to be.
//   - A PROJECTOR_ variable no command reads is reported before anything
//     runs: refused when it is one or two letters away from one that is
//     read (a misspelt PROJECTOR_DATABSE_URL would otherwise fall back to
//     the default database), warned about otherwise. The names of
//     reservedEnv, and those Kubernetes sets for a Service named
//     projector, are not reported.
//
// --help and docs/configuration.md show each flag's variable, from envVar.

// envPrefix begins every variable the commands read.
const envPrefix = "PROJECTOR_"

// ownEnv lists, per command (its path after "projector"), the flags whose
// variable is PROJECTOR_<COMMAND>_<FLAG>: those that mean something else,
// or default to something else, than a flag of the same name of another
// command. The dlq commands' filters all have their own, so that a filter
// left set for dlq list does not decide what a replay or a purge selects;
// so do tombstones forget's, so that no variable left set chooses whose
// tombstone is deleted. rebuild start's --config is empty unless given
// (the live definition), and rebuild cleanup's --projection chooses what
// is dropped.
// TestEnvOneMeaning walks the command tree and fails when a variable
// would be read by two flags of different defaults or usage.
var ownEnv = map[string][]string{
	"dev":               {"identity", "http-addr", "partitions"},
	"demo":              {"http-addr", "log-level", "partitions", "timeout"},
	"produce":           {"brokers", "registry-url", "topic", "key", "timeout"},
	"check":             {"projection"},
	"status":            {"json"},
	"offsets list":      {"json"},
	"offsets reset":     {"topic", "partitions", "actor", "json"},
	"offsets audit":     {"limit", "json"},
	"dlq list":          {"identity", "projection", "topic", "key", "error-class", "status", "since", "until", "limit", "json"},
	"dlq show":          {"json"},
	"dlq replay":        {"identity", "projection", "topic", "key", "error-class", "status", "since", "until", "limit", "id", "actor"},
	"dlq purge":         {"identity", "projection", "topic", "key", "error-class", "status", "since", "until", "limit", "id", "actor"},
	"dlq redrive":       {"identity", "projection", "topic", "key", "error-class", "status", "since", "until", "limit", "id", "actor"},
	"dlq audit":         {"limit", "json"},
	"relay":             {"unready-after"},
	"tombstones forget": {"projection", "key"},
	"rebuild start":     {"config"},
	"rebuild cleanup":   {"projection"},
	"version":           {"json"},
	"config print":      {"json"},
	"asyncapi":          {"format"},
}

// commandLineOnly are the flags that confirm a destructive action, with
// no variable: offsets reset --execute and dlq replay --execute apply and
// produce, --dry-run=false does the same, dlq purge --yes deletes, dev
// --take-over-identity moves another identity's offsets back to 0.
var commandLineOnly = map[string]bool{
	"execute":            true,
	"dry-run":            true,
	"yes":                true,
	"take-over-identity": true,
}

// reservedEnv are the PROJECTOR_ variables that the repository's scripts
// and tests read, not the commands: a shell that runs both must not be
// warned about them. A name ending in _ stands for every name it begins
// (projector-bench's own flags read PROJECTOR_BENCH_<FLAG>).
var reservedEnv = []string{
	"PROJECTOR_BENCH_",             // projector-bench's flags and its child runs
	"PROJECTOR_TEST_DATABASE_URL",  // the tests' PostgreSQL
	"PROJECTOR_TEST_KAFKA_BROKERS", // the tests' Apache Kafka (scripts/kafka up)
	"PROJECTOR_TEST_KAFKA_CONTROL", // scripts/test-kafka: the script that stops and starts its nodes
	"PROJECTOR_TEST_REGISTRY_URL",  // the tests' Schema Registry (scripts/registry up)
	"PROJECTOR_TEST_CHILD_ARGS",    // a test that runs a command in a child process
	"PROJECTOR_RECOVERY_MATRIX",    // the recovery test's whole matrix
	"PROJECTOR_RECOVERY_REPORT",    // the recovery test's report file
	"PROJECTOR_KAFKA_CACHE",        // scripts/kafka
	"PROJECTOR_KAFKA_RUN",
	"PROJECTOR_KAFKA_PORT",
	"PROJECTOR_KAFKA_HEAP",
	"PROJECTOR_REGISTRY_CACHE", // scripts/registry
	"PROJECTOR_REGISTRY_RUN",
	"PROJECTOR_REGISTRY_PORT",
	"PROJECTOR_REGISTRY_HEAP",
	"PROJECTOR_CONNECT_CACHE", // scripts/connect
	"PROJECTOR_CONNECT_HEAP",
	// The SASL listeners of the tests' Apache Kafka (scripts/kafka up --sasl).
	"PROJECTOR_TEST_KAFKA_SASL_BROKERS",
}

// envWord is s in a variable's form: upper case, _ for - and for spaces.
func envWord(s string) string {
	return strings.NewReplacer("-", "_", " ", "_").Replace(strings.ToUpper(s))
}

// envVar is the variable the flag name of the command at path ("projector
// dlq list") reads, or "" when the flag is taken from the command line
// only.
func envVar(path, name string) string {
	if commandLineOnly[name] {
		return ""
	}
	cmd := strings.TrimPrefix(path, "projector ")
	if slices.Contains(ownEnv[cmd], name) {
		return envPrefix + envWord(cmd) + "_" + envWord(name)
	}
	return envPrefix + envWord(name)
}

// envNote is what --help adds to a flag's usage about its variable.
func envNote(path, name string) string {
	if v := envVar(path, name); v != "" {
		return v
	}
	return "command line only"
}

// reserved reports whether name is one of reservedEnv.
func reserved(name string) bool {
	for _, r := range reservedEnv {
		if name == r || strings.HasSuffix(r, "_") && strings.HasPrefix(name, r) {
			return true
		}
	}
	return false
}

// serviceLinkName matches the variables Kubernetes gives every pod for
// each Service of its namespace (enableServiceLinks): a Service named
// projector, as in the deployment example, or projector-relay brings
// PROJECTOR_SERVICE_HOST, PROJECTOR_PORT_8080_TCP_ADDR,
// PROJECTOR_RELAY_SERVICE_PORT and the like.
var serviceLinkName = regexp.MustCompile(`^PROJECTOR_([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$`)

// serviceLink reports whether the variable name=value is one Kubernetes
// sets for a Service, which the commands neither read nor report. Its
// bare <SERVICE>_PORT is told by its value, tcp://10.0.0.1:8080.
func serviceLink(name, value string) bool {
	if serviceLinkName.MatchString(name) {
		return true
	}
	if !strings.HasSuffix(name, "_PORT") {
		return false
	}
	scheme, _, ok := strings.Cut(value, "://")
	return ok && (scheme == "tcp" || scheme == "udp" || scheme == "sctp")
}

// environ returns the PROJECTOR_ variables that are set and not empty, by
// name, sorted.
func environ() map[string]string {
	vars := map[string]string{}
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && value != "" {
			vars[name] = value
		}
	}
	return vars
}

// readEnv runs before the command at path: it refuses a misspelt
// variable, says which variables it ignores, and sets every flag of fs
// that the command line did not give from its variable.
func (c *cli) readEnv(path string, fs *flag.FlagSet) error {
	vars := environ()
	names := make([]string, 0, len(vars))
	for name := range vars {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if c.knownEnv[name] || reserved(name) || serviceLink(name, vars[name]) || commandLineOnly[strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, envPrefix), "_", "-"))] {
			continue // a confirmation's variable is said to be ignored below
		}
		if near := c.nearestEnv(name); near != "" {
			return &usageError{msg: fmt.Sprintf("unknown environment variable %s: did you mean %s?", name, near)}
		}
		if f, ok := c.formerEnv(path, fs, name); ok {
			fmt.Fprintf(c.stderr, "projector: unknown environment variable %s ignored: %s's --%s reads %s\n", name, strings.TrimPrefix(path, "projector "), f, envVar(path, f))
			continue
		}
		fmt.Fprintf(c.stderr, "projector: unknown environment variable %s ignored: no command reads it\n", name)
	}

	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		if commandLineOnly[f.Name] {
			if name := envPrefix + envWord(f.Name); vars[name] != "" {
				fmt.Fprintf(c.stderr, "projector: %s is ignored: --%s is taken from the command line only, so that a variable left in a shell or a deployment cannot turn a dry run into a real one\n", name, f.Name)
			}
			return
		}
		name := envVar(path, f.Name)
		value, ok := vars[name]
		if given[f.Name] || !ok {
			return
		}
		if serr := fs.Set(f.Name, value); serr != nil {
			// checked.Set has worded the refusal after the flag.
			err = c.badValue
			if err == nil {
				err = &usageError{msg: fmt.Sprintf("invalid value %q for --%s: %v", value, f.Name, serr)}
			}
			err = &usageError{msg: name + ": " + err.Error()}
			c.badValue = nil // execute would return it without the variable's name
		}
	})
	return err
}

// formerEnv reports which flag of fs an unknown variable name stands for
// when the flag reads a variable of another name: PROJECTOR_TOPIC for
// produce's --topic, whose variable is PROJECTOR_PRODUCE_TOPIC.
func (c *cli) formerEnv(path string, fs *flag.FlagSet, name string) (string, bool) {
	f := fs.Lookup(strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, envPrefix), "_", "-")))
	if f == nil || envVar(path, f.Name) == "" {
		return "", false
	}
	return f.Name, true
}

// nearestEnv is the variable some command reads that name is a misspelling
// of, or "": one edit away, or two in a name of eight letters or more
// after PROJECTOR_.
func (c *cli) nearestEnv(name string) string {
	word := strings.TrimPrefix(name, envPrefix)
	limit := 1
	if len(word) >= 8 {
		limit = 2
	}
	best, bestDist := "", limit+1
	for known := range c.knownEnv {
		if d := editDistance(word, strings.TrimPrefix(known, envPrefix)); d < bestDist || d == bestDist && known < best {
			best, bestDist = known, d
		}
	}
	if bestDist > limit {
		return ""
	}
	return best
}
