package projector

import "time"

// SetWatch shortens e's watch of its standing with Kafka: it looks every
// every and speaks of a member out of its group after joinWarn.
func SetWatch(e *Engine, every, joinWarn time.Duration) {
	e.watch.every, e.watch.joinWarn, e.watch.request = every, joinWarn, time.Second
}
