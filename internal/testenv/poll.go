package testenv

import (
	"errors"
	"testing"
	"time"
)

// pollEvery is how often WaitFor checks its condition.
const pollEvery = 10 * time.Millisecond

// WaitFor checks cond until it returns nil, and fails the test with
// cond's last error once timeout has passed: tests wait on an outcome, not
// on a sleep that may be too short on a slow machine.
func WaitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v: %v", timeout, err)
		}
		<-tick.C
	}
}

// Holds adapts a condition that can only say yes or no to WaitFor; the
// error names what was awaited. Prefer a condition that returns what it
// saw instead, so that a timeout says why.
func Holds(what string, cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errors.New(what + ": not yet")
	}
}
