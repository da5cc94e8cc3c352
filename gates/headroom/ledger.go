package headroom

import "time"

// ledger counts the calls the gate admitted (to the pool, or to one pod)
// until ReleaseGrace after their release: a call sluice ended leaves the
// pod's gauges only at the pod's next step, and counted as other traffic
// in between it would shrink the limit and take back another. It is not
// safe for concurrent use; the gate holds its lock.
type ledger struct {
	own      int
	releases []time.Time // releases still within the grace, oldest first
}

// admit counts one more call.
func (l *ledger) admit() { l.own++ }

// release records that one call ended at now.
func (l *ledger) release(now time.Time) { l.releases = append(l.releases, now) }

// at applies the releases older than grace at now and returns the calls
// still counted.
func (l *ledger) at(now time.Time, grace time.Duration) int {
	cut := now.Add(-grace)
	n := 0
	for n < len(l.releases) && !l.releases[n].After(cut) {
		n++
	}
	l.own -= n
	l.releases = append(l.releases[:0], l.releases[n:]...)
	return l.own
}

// live returns the calls admitted and not released yet: what runs now. A
// call released within the grace counts in at (the pod may still show it)
// but not here: a call that finished has left its seat, and the room a
// limit leaves is measured against what runs.
func (l *ledger) live() int { return l.own - len(l.releases) }

// PeakHold remembers the highest others of the readings within a hold: the
// limit falls at once when the other traffic grows and rises only once it
// stayed lower for the hold. It is a monotonic queue (O(1) amortized per
// reading), not safe for concurrent use. Exported, as Rule is, so that the
// interactive-frontier benchmark replays the gate's own hold.
type PeakHold struct {
	peaks []peak // a falling sequence of the readings within the hold
}

// peak is one reading's others, kept while no later reading exceeds it
// and it is younger than the hold.
type peak struct {
	at     time.Time
	others int
}

// Held records others at now and returns the highest of the readings
// within hold (now's included); a negative hold remembers nothing.
func (h *PeakHold) Held(now time.Time, hold time.Duration, others int) int {
	if hold < 0 {
		return others
	}
	for len(h.peaks) > 0 && h.peaks[len(h.peaks)-1].others <= others {
		h.peaks = h.peaks[:len(h.peaks)-1]
	}
	h.peaks = append(h.peaks, peak{now, others})
	cut := now.Add(-hold)
	n := 0
	for n < len(h.peaks)-1 && !h.peaks[n].at.After(cut) {
		n++
	}
	h.peaks = append(h.peaks[:0], h.peaks[n:]...)
	return h.peaks[0].others
}
