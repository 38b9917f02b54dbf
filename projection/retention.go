package projection

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// RetentionOff is how a retention that keeps forever is written.
const RetentionOff = "off"

// ParseRetention reads a retention: a positive duration such as 72h or
// 90m, a whole number of days such as 7d, or off, returned as -1 (kept
// forever). 0 is refused rather than taken to mean off: a retention of
// nothing would prune a tombstone as soon as it is written.
func ParseRetention(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, RetentionOff) {
		return -1, nil
	}
	bad := errors.New("want a positive duration such as 7d, 72h or 90m, or off to keep forever")
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 32)
		if err != nil || n <= 0 {
			return 0, bad
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, bad
	}
	return d, nil
}

// FormatRetention writes a retention as ParseRetention reads it: off for
// a negative one, whole days as 7d, anything else as a duration.
func FormatRetention(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d < 0:
		return RetentionOff
	case d > 0 && d%day == 0:
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}
