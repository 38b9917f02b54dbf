// Package check proves a projection file against the Schema Registry and
// PostgreSQL before anything runs: every reader schema resolves against
// the writer schemas it will meet, every field the file names exists with
// a type its column takes, the defaults parse as their column types and
// an existing table matches. A mistake that would dead-letter every event
// is found here, as one line per problem, instead of by its effect.
//
// It writes nothing: its Postgres probes run in a read-only transaction
// that is rolled back. projector check runs it, and so does every
// projector run before it creates or joins anything.
package check
