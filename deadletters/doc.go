// Package deadletters owns the dead letters projector keeps in Postgres:
// their tables (projector_dead_letters, the audit log and the publish
// outbox) and every query on them: writing them in a batch's
// transaction, listing, showing, marking as replayed, purging, auditing,
// counting, and claiming the outbox for publishing. The Postgres sink, the
// publisher and the command line all go through it.
//
// It must not consume from or produce to Kafka, nor decide what is a dead
// letter: the partition worker does, and the publisher produces.
package deadletters
