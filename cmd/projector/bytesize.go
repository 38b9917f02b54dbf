package main

import (
	"errors"
	"fmt"
	"math"

	"github.com/dustin/go-humanize"
)

// byteSize is a flag of a size in bytes, written with or without a unit:
// 268435456, 256MiB, 256 MiB, 300MB.
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
