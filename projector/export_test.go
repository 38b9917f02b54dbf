package projector

import "time"

// SetWatch shortens e's watch of its standing with Kafka: it looks every
// every and speaks of a member out of its group after joinWarn.
func SetWatch(e *Engine, every, joinWarn time.Duration) {
	e.watch.every, e.watch.joinWarn, e.watch.request = every, joinWarn, time.Second
}

// SetMirrorClock sets the clock that paces e's log lines about failed
// commits to its Kafka group.
func SetMirrorClock(e *Engine, now func() time.Time) { e.mirror.now = now }

// SetLagWatch has e look at the partitions no member runs, and the halted
// ones, every every.
func SetLagWatch(e *Engine, every time.Duration) {
	e.watch.unowned, e.watch.request = every, time.Second
}
