// Package versioning makes the per-aggregate version decisions of the
// engine: a version at or below the applied one is stale and ignored, the
// next version applies, a version beyond the next one is parked until the
// versions before it arrive (or until it is repaired).
//
// It is pure: no I/O, no clock, no logging. The partition worker feeds it
// events in offset order and persists what it decides.
package versioning
