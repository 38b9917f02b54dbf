// Package dlqpublish moves dead letters back onto Kafka: Publisher copies
// new dead letters to a dead-letter topic (from the projector_dlq_outbox
// table, with Kafka Connect's error headers), and Replay produces dead
// letters again to their original topic so the consumer can retry them.
//
// Both only produce, and read and mark the dead letters through package
// deadletters. The consumer recognises a replayed record by its
// sinks.ReplayHeader header: the version gate makes a replay of an
// applied event a no-op, and a replay that fails again updates the same
// dead letter.
//
// It must not consume from Kafka or decide what applies: the partition
// worker does.
package dlqpublish
