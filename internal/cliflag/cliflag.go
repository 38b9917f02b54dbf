// Package cliflag holds the flag values projector's commands share, so
// that `projector run` and the benchmark read sizes and "0: off" flags the
// same way.
package cliflag

import (
	"time"

	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// ByteSize is a flag of a size in bytes, written with or without a unit:
// 268435456, 256MiB, 256 MiB, 300MB.
type ByteSize int64

func (b *ByteSize) String() string { return humanize.IBytes(uint64(*b)) }

// Set parses s as a size in bytes.
func (b *ByteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return errors.New("a size like 64MiB, 300MB or 268435456 (bytes)")
	}
	if n > math.MaxInt64 {
		return errors.New("too large")
	}
	*b = ByteSize(n)
	return nil
}

// Off maps a flag whose 0 turns its feature off (--state-cache-rows,
// --member-max-records) to the engine's setting, where 0 means the default
// and a negative value off.
func Off(flag int) int {
	if flag == 0 {
		return -1
	}
	return flag
}

// CacheBytes maps the --state-cache-bytes flag (0: off) to the engine's
// StateCacheBytes (0: the default, negative: off).
func CacheBytes(flag ByteSize) int64 {
	if flag == 0 {
		return -1
	}
	return int64(flag)
}

// OffDuration maps a duration flag whose 0 turns its feature off
// (--progress-every) to the engine's setting, where 0 means the default
// and a negative value off.
func OffDuration(flag time.Duration) time.Duration {
	if flag == 0 {
		return -1
	}
	return flag
}

// Share is a flag of a share of records, more than 0 and at most 1, or
// off: 0.5, 1, off. Only the word off turns its feature off: a 0 is
// refused, since a share of 0 reads as the strictest setting, not as none.
// Its zero value is off.
type Share float64

func (s *Share) String() string {
	if *s == 0 {
		return "off"
	}
	return strconv.FormatFloat(float64(*s), 'g', -1, 64)
}

// Set parses v as a share, or off.
func (s *Share) Set(v string) error {
	if strings.EqualFold(strings.TrimSpace(v), "off") {
		*s = 0
		return nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err == nil && f == 0 {
		return errors.New("want a share more than 0 and at most 1, such as 0.5; 0 does not mean off: write off for that")
	}
	if err != nil || math.IsNaN(f) || f < 0 || f > 1 {
		return errors.New("want a share more than 0 and at most 1, such as 0.5, or off")
	}
	*s = Share(f)
	return nil
}

// ShareOff maps a share flag whose off turns its feature off
// (--dead-letter-storm-share) to the engine's setting, where 0 means the
// default and a negative value off.
func ShareOff(flag Share) float64 {
	if flag == 0 {
		return -1
	}
	return float64(flag)
}
