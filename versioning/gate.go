package versioning

// Outcome is what the gate decided for one offered event.
type Outcome uint8

const (
	// Applied: the event carried the next version and was applied.
	Applied Outcome = iota + 1
	// Stale: the version was already applied (or is already parked): a
	// duplicate or a late, out-of-order copy. Ignored.
	Stale
	// Parked: the version is beyond the next one; the event waits until the
	// versions before it have been applied.
	Parked
)

// String returns the outcome as used in metric labels.
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	case Parked:
		return "parked"
	}
	return "unknown"
}

// Decide classifies version v against the aggregate's current (last applied)
// version. Versions are 1-based; current 0 means nothing applied yet.
func Decide(current, v int64) Outcome {
	switch {
	case v <= current:
		return Stale
	case v == current+1:
		return Applied
	default:
		return Parked
	}
}

// Aggregate is the gate for one aggregate: its last applied version and the
// events parked beyond it. The zero value is an aggregate with nothing
// applied. E is the caller's event type; the gate never looks inside it.
type Aggregate[E any] struct {
	// Version is the last applied version (0: none).
	Version int64
	parked  map[int64]E
}

// Restore puts back an event parked in an earlier batch. An event at or
// below Version is dropped: it can never apply.
func (a *Aggregate[E]) Restore(v int64, e E) {
	if v <= a.Version {
		return
	}
	if a.parked == nil {
		a.parked = make(map[int64]E, 2)
	}
	if _, dup := a.parked[v]; !dup {
		a.parked[v] = e
	}
}

// Offer decides for event e with version v. When v is the next version,
// apply is called with e and then with every parked successor that has
// become contiguous, in version order. If apply returns an error for an
// event, that event is not applied: Version stays before it, the event
// leaves the gate (the caller owns it now, e.g. dead-letters it), later
// parked events stay parked, and Offer returns the error.
//
// An event whose version is already parked is Stale: the first copy wins.
func (a *Aggregate[E]) Offer(v int64, e E, apply func(v int64, e E) error) (Outcome, error) {
	switch Decide(a.Version, v) {
	case Stale:
		return Stale, nil
	case Parked:
		if _, dup := a.parked[v]; dup {
			return Stale, nil
		}
		if a.parked == nil {
			a.parked = make(map[int64]E, 2)
		}
		a.parked[v] = e
		return Parked, nil
	}
	if err := apply(v, e); err != nil {
		return Applied, err
	}
	a.Version = v
	// A copy of v can be parked only if Restore put it there at Version+1.
	// It is now at or below Version and can never apply: drop it, as
	// Restore would, so it does not linger as a phantom parked event.
	delete(a.parked, v)
	return Applied, a.drain(apply)
}

// drain applies parked events that follow Version without a hole.
func (a *Aggregate[E]) drain(apply func(v int64, e E) error) error {
	for len(a.parked) > 0 {
		next := a.Version + 1
		e, ok := a.parked[next]
		if !ok {
			return nil
		}
		delete(a.parked, next)
		if err := apply(next, e); err != nil {
			return err
		}
		a.Version = next
	}
	return nil
}

// Jump moves the aggregate to version v without applying the events in
// between (a repaired snapshot, or a snapshot accepted over a gap). Parked
// events at or below v are returned to the caller through drop (they are
// superseded); parked events above v that are now contiguous are applied.
func (a *Aggregate[E]) Jump(v int64, drop func(v int64, e E), apply func(v int64, e E) error) error {
	if v <= a.Version {
		return nil
	}
	a.Version = v
	for pv, e := range a.parked {
		if pv <= v {
			delete(a.parked, pv)
			if drop != nil {
				drop(pv, e)
			}
		}
	}
	return a.drain(apply)
}

// ParkedCount is the number of events waiting for a missing version.
func (a *Aggregate[E]) ParkedCount() int { return len(a.parked) }

// EachParked calls fn for every parked event, in no particular order.
func (a *Aggregate[E]) EachParked(fn func(v int64, e E)) {
	for v, e := range a.parked {
		fn(v, e)
	}
}

// Missing is the first version the aggregate waits for when events are
// parked, or 0 when nothing is parked.
func (a *Aggregate[E]) Missing() int64 {
	if len(a.parked) == 0 {
		return 0
	}
	return a.Version + 1
}
