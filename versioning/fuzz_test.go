package versioning

import "testing"

// FuzzGate reads each byte as one event: the low five bits are its version
// (1..32), bit 6 picks one of two aggregates, and bit 7 restarts the gates
// (persist and rebuild) before the event. poison%33, when not 0, is a version
// of aggregate 0 whose apply always fails. The gates must end as the
// reference fold says.
func FuzzGate(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, uint8(0))             // 1 2 3 4 in order
	f.Add([]byte{1, 0, 0, 3, 2, 1}, uint8(0))       // swap, duplicates
	f.Add([]byte{4, 3, 2, 0x80 | 1, 0}, uint8(0))   // reverse, restart while parked
	f.Add([]byte{0, 2, 3, 0x40, 0x41, 1}, uint8(0)) // gap then fill, two aggregates
	f.Add([]byte{0, 2, 3, 1, 1, 2}, uint8(2))       // version 2 poisoned
	f.Add([]byte{31, 30, 0x80 | 0, 0xc0, 5}, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, poison uint8) {
		events := make([]ev, len(data))
		restartBefore := map[int]bool{}
		for i, b := range data {
			events[i] = ev{v: int64(b&0x1f) + 1, seq: i, agg: int(b>>6) & 1}
			if b&0x80 != 0 {
				restartBefore[i] = true
			}
		}
		poisoned := map[int]int64{}
		if p := int64(poison % 33); p != 0 {
			poisoned[0] = p
		}
		runScenario(t, events, restartBefore, poisoned, true)
	})
}
