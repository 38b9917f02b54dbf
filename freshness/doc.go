// Package freshness tells how fresh a projection's rows are and waits
// until a row is fresh enough: the read API's read-your-writes.
//
// One Watcher serves a process. A request waiting for an aggregate to
// reach a version registers with it; the watcher reads, once every poll
// interval, only the rows someone waits on, one statement per projection
// whatever the number of waiters, and wakes the waiters whose version
// was reached. The engine's transactions pay nothing for it: no
// notification is sent from them, and the watcher's reads are by primary
// key.
//
// Staleness is how far behind the Kafka partition that owns a key is,
// from what the engine stores in projector_offsets: see Watcher.Staleness
// and docs/freshness.md.
package freshness
