package postgres

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projector-dev/projector/sinks"
)

// Only errors that say the statement itself does not fit the database
// are marked as such: data errors stay row-level, and everything else
// (Postgres down, a serialization failure, a deadlock) stays transient.
func TestRefusedStatementClasses(t *testing.T) {
	for _, tc := range []struct {
		code string
		want bool
	}{
		{"42703", true},  // undefined column
		{"42P01", true},  // undefined table
		{"42501", true},  // insufficient privilege
		{"0A000", true},  // feature not supported
		{"26000", true},  // prepared statement missing
		{"3F000", true},  // schema missing
		{"22P02", false}, // invalid text: a row's data
		{"23505", false}, // unique violation: a row's data
		{"54000", false}, // index entry too large: a row's data
		{"40001", false}, // serialization failure
		{"40P01", false}, // deadlock
		{"57P01", false}, // admin shutdown
		{"08006", false}, // connection failure
		{"25006", false}, // read-only transaction: a standby, until failover ends
	} {
		err := refused(fmt.Errorf("write batch: %w", &pgconn.PgError{Code: tc.code}))
		if got := errors.Is(err, sinks.ErrBadStatement); got != tc.want {
			t.Errorf("SQLSTATE %s: marked as a refused statement %v, want %v (%v)", tc.code, got, tc.want, err)
		}
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != tc.code {
			t.Errorf("SQLSTATE %s: Postgres's error no longer found in %v", tc.code, err)
		}
	}
	if err := refused(io.ErrUnexpectedEOF); errors.Is(err, sinks.ErrBadStatement) {
		t.Errorf("a broken connection marked as a refused statement: %v", err)
	}
	if refused(nil) != nil {
		t.Error("refused(nil) is not nil")
	}
}
