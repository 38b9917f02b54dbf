package main

import (
	"errors"
	"fmt"
	"math"

	"github.com/dustin/go-humanize"
)

// byteSize is a flag of a size in bytes, written with or without a unit
// (268435456, 256MiB, 256 MiB, 300MB), as projector run takes it.
type byteSize int64

func (b *byteSize) String() string { return humanize.IBytes(uint64(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return errors.New("want a size in bytes, with or without a unit, such as 256MiB")
	}
	if n > math.MaxInt64 {
		return fmt.Errorf("%s: too large", s)
	}
	*b = byteSize(n)
	return nil
}

// offFlag maps a flag whose 0 turns its feature off (--state-cache-rows,
// --member-max-records) to the bench.Config field, where 0 means the
// default and a negative value off, as projector run maps it.
func offFlag(flag int) int {
	if flag == 0 {
		return -1
	}
	return flag
}

// cacheBytes maps the --state-cache-bytes flag (0: off) to
// bench.Config.StateCacheBytes (0: the default, negative: off).
func cacheBytes(flag byteSize) int64 {
	if flag == 0 {
		return -1
	}
	return int64(flag)
}
