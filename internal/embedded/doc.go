// Package embedded runs an in-process Kafka broker (kfake) and Schema
// Registry (srfake) for the commands that work without a cluster of their
// own: projector demo and projector dev. It owns their addresses and the
// adjustments that let clients other than franz-go use them; it must not be
// imported by any other command of the production binary.
package embedded
