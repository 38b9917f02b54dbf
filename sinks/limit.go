package sinks

import "fmt"

// LimitError reports a transaction that met a limit Postgres sets on a
// statement or a transaction (statement_timeout, transaction_timeout,
// idle_in_transaction_session_timeout, temp_file_limit): the same
// transaction would meet it again, where a smaller one may not. A worker
// commits fewer records per transaction after one (see package
// partition).
type LimitError struct {
	// SQLState is Postgres's code for the failure (57014, 25P04, 25P03,
	// 53400).
	SQLState string
	// Setting names the setting the limit is most likely, and Value its
	// value in a session of the sink ("" when it could not be read).
	Setting, Value string
	Err            error
}

func (e *LimitError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("%v (%s is %s)", e.Err, e.Setting, e.Value)
	}
	return fmt.Sprintf("%v (%s)", e.Err, e.Setting)
}

func (e *LimitError) Unwrap() error { return e.Err }
