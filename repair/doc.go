// Package repair fetches what an aggregate is missing when its events are
// parked behind a gap for longer than the engine is willing to wait.
//
// It owns repair sources: the Repairer interface, an HTTP source (GET a URL
// templated with the key and the missing version) and a SQL source (a query
// run with the key and the missing version), the decoding of what they
// return into either a full snapshot or the missing events, and the checks
// that make a result usable: a snapshot at or beyond the missing version,
// events starting exactly at the missing version with no holes. It also
// classifies failures: ErrNotFound when the source has nothing for the gap,
// IsTransient for failures worth retrying.
//
// It does not own the gap itself. A repair source never writes to the
// projection's table, never decides which version is missing, when to ask,
// how often to retry, or whether a result is applied: the engine does. A
// Repairer only reads, so asking twice is harmless, and the sources here are
// safe for concurrent use.
package repair
