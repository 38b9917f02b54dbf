package repair

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector-dev/projector/projection"
)

// Result is what a repair source returns for one aggregate.
type Result struct {
	// Snapshot: the aggregate's full state at Version, column/field name →
	// value (Row values: int64, float64, bool, string, nil; JSON objects and
	// arrays as their JSON text string).
	Snapshot projection.Row
	// Events: the missing events from the requested version on, in version
	// order, each with Key, Version, Type and Fields (decoded JSON; numbers
	// as int64 when integral, else float64; nil Fields for a tombstone).
	// Exactly one of Snapshot and Events is set.
	Events []projection.Event
	// Version is the version the aggregate is at after applying the result:
	// the snapshot's version, or the last event's version.
	Version int64
}

// Repairer fetches an aggregate's state at a version at or beyond missing.
// It returns an error wrapping ErrNotFound when the source has nothing for
// the gap; other errors are to be retried when IsTransient says so.
type Repairer interface {
	Repair(ctx context.Context, key string, missing int64) (Result, error)
}

// ErrNotFound means the source has nothing at or beyond the missing version
// for the key. It is terminal for this gap: asking again will not help.
var ErrNotFound = errors.New("repair source has nothing at or beyond the missing version")

// IsTransient reports whether err is worth retrying: network errors,
// timeouts, HTTP 5xx and 429, and Postgres connection failures (SQLSTATE
// class 08, 57P01-57P03, class 53, 40001, 40P01, 57014). A cancelled
// context, ErrNotFound and malformed or inconsistent results are not
// transient.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return transientSQLState(pgErr.Code)
	}
	var se *statusError
	if errors.As(err, &se) {
		return se.code >= 500 || se.code == http.StatusTooManyRequests
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return true
	}
	var ae *acquireError
	if errors.As(err, &ae) {
		return true
	}
	return inChain(err, func(e error) bool {
		if t, ok := e.(interface{ Timeout() bool }); ok && t.Timeout() {
			return true
		}
		switch e := e.(type) {
		case *net.OpError:
			return true
		case syscall.Errno:
			return slices.Contains([]syscall.Errno{
				syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
				syscall.EPIPE, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH,
			}, e)
		}
		return e == io.EOF || e == io.ErrUnexpectedEOF || e == net.ErrClosed
	})
}

// transientSQLState reports whether a SQLSTATE names a failure of the
// connection or the server's capacity rather than of the query.
func transientSQLState(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"), // connection exception
		strings.HasPrefix(code, "53"), // insufficient resources
		code == "57P01",               // admin_shutdown
		code == "57P02",               // crash_shutdown
		code == "57P03",               // cannot_connect_now
		code == "57014",               // query_canceled (statement_timeout)
		code == "40001",               // serialization_failure
		code == "40P01":               // deadlock_detected
		return true
	}
	return false
}

// inChain reports whether f holds for err or any error it wraps.
func inChain(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return inChain(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		return slices.ContainsFunc(u.Unwrap(), func(e error) bool { return inChain(e, f) })
	}
	return false
}

// statusError is an HTTP response other than 200 and 404.
type statusError struct {
	code   int
	status string
	body   string // the start of the body, for the message
}

func (e *statusError) Error() string {
	msg := "HTTP " + e.status
	if e.body != "" {
		msg += ": " + e.body
	}
	return msg
}

// acquireError is a failure to get a connection from the pool.
type acquireError struct{ err error }

func (e *acquireError) Error() string { return "acquire connection: " + e.err.Error() }
func (e *acquireError) Unwrap() error { return e.err }

// snapshotResult checks a snapshot against the missing version.
func snapshotResult(missing, version int64, state projection.Row) (Result, error) {
	if version < missing {
		return Result{}, fmt.Errorf("source is behind: its snapshot is at version %d, version %d is missing", version, missing)
	}
	return Result{Snapshot: state, Version: version}, nil
}

// eventsResult sorts events by version, drops those before missing and
// checks the rest run from missing without holes. No events at all is
// ErrNotFound.
func eventsResult(key string, missing int64, events []projection.Event) (Result, error) {
	if len(events) == 0 {
		return Result{}, ErrNotFound
	}
	slices.SortStableFunc(events, func(a, b projection.Event) int {
		switch {
		case a.Version < b.Version:
			return -1
		case a.Version > b.Version:
			return 1
		}
		return 0
	})
	for i := 1; i < len(events); i++ {
		if events[i].Version == events[i-1].Version {
			return Result{}, fmt.Errorf("two events have version %d", events[i].Version)
		}
	}
	last := events[len(events)-1].Version
	i, _ := slices.BinarySearchFunc(events, missing, func(e projection.Event, v int64) int {
		switch {
		case e.Version < v:
			return -1
		case e.Version > v:
			return 1
		}
		return 0
	})
	events = events[i:]
	if len(events) == 0 {
		return Result{}, fmt.Errorf("source is behind: its last event is version %d, version %d is missing", last, missing)
	}
	if events[0].Version != missing {
		return Result{}, fmt.Errorf("hole in events: %s missing, the source's events from there on start at version %d", versions(missing, events[0].Version-1), events[0].Version)
	}
	for i := range events {
		if i > 0 && events[i].Version != events[i-1].Version+1 {
			return Result{}, fmt.Errorf("hole in events: %s missing between versions %d and %d", versions(events[i-1].Version+1, events[i].Version-1), events[i-1].Version, events[i].Version)
		}
		events[i].Key = key
	}
	return Result{Events: events, Version: events[len(events)-1].Version}, nil
}

func versions(from, to int64) string {
	if from == to {
		return fmt.Sprintf("version %d is", from)
	}
	return fmt.Sprintf("versions %d..%d are", from, to)
}

func checkMissing(missing int64) error {
	if missing < 1 {
		return fmt.Errorf("missing version %d: versions start at 1", missing)
	}
	return nil
}
