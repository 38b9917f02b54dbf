// Package rebuild runs a projection's generations and the operations that
// rebuild it under a new consumer identity while the live generation keeps
// serving.
//
// A generation of a projection is its compiled definition, its physical
// table, its consumer identity (group id and stored offsets) and a state:
// building, live, retired, dropped or cancelled. Generation 1 of a
// projection is the one projector ran before any rebuild: its physical
// table is the projection's table and its identity the deployment's.
// Every later generation N writes <table>__g<N> under the identity
// <identity>.<projection>.g<N>; once one has cut over, the projection's
// table name is a view of the live generation's table, so plain SQL
// readers and projector itself always read the live generation.
//
// A rebuild is an operation stored in Postgres. Every replica's Supervisor
// takes part: it checks that the topic still holds its history, creates
// the new generation's table, runs the new generation's engine from the
// earliest offset beside the live one (throttled), reports progress, and
// once every partition is near the log end, cuts over in one transaction
// that takes its locks with a short lock_timeout and tries again. See
// docs/rebuilds.md.
package rebuild
