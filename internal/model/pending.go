package model

import (
	"fmt"
	"slices"
)

// PendingEntries models the redis-stream transport's ownership of pending
// entries (transports/redisstream): a request is an entry of the stream; a
// consumer of the group reads new entries in stream order (XREADGROUP >)
// and takes over entries idle for claim_idle_ms from other consumers
// (XAUTOCLAIM); its heartbeat resets the idle time of the entries it still
// owns (XCLAIM JUSTID in a script, only if still its own); every write that
// ends a delivery — the result, a hand-back (the request appended again as a
// new entry) — runs in one script with the XACK, fenced by ownership
// (XPENDING names the consumer).
//
// The model checks the transport's moves rather than predicting them, since
// which idle entries one XAUTOCLAIM returns depends on its cursor: Deliver
// reports a delivery that was not allowed.
//
// Invariants:
//   - exactly one result per request and enqueue: a request is in exactly
//     one of unread, pending or answered, and has at most one result;
//   - no two holders of a live entry: an entry is pending for one consumer,
//     and is taken over only once it was idle;
//   - a stale holder writes nothing: a consumer whose entry was taken over
//     (or handed back) writes no result and appends nothing (Settle and
//     HandBack report false);
//   - new entries are delivered in stream order.
//
// Time is Redis' clock in the model's seconds, moved only by Jump: an
// entry is idle once IdleTTL has passed since its delivery or its last
// heartbeat (XPENDING's idle time, by Redis' clock), so a forward jump
// makes the entries it passes idle and a backward one makes them live again.
type PendingEntries struct {
	// IdleTTL is claim_idle_ms in the model's seconds.
	IdleTTL int64

	now      int64
	unread   []string // requests of entries not yet read by the group, in stream order
	pending  map[string]*Pending
	results  map[string]int
	enqueued []string
}

// Pending is the entry a request is pending as: its id, its consumer, and
// whether it is idle (its consumer missed its heartbeats for claim_idle_ms).
type Pending struct {
	Entry, Consumer string
	Idle            bool  // in PendingOf's snapshots; the model keeps At
	At              int64 // the delivery (or last heartbeat) on the model's clock
	logged          int64 // the delivery time the append-only file holds (see Restart)
}

// NewPendingEntries returns an empty stream and group, claim_idle_ms ten
// minutes.
func NewPendingEntries() *PendingEntries {
	return &PendingEntries{IdleTTL: 600, pending: map[string]*Pending{}, results: map[string]int{}}
}

func (p *PendingEntries) idle(pe *Pending) bool { return p.now-pe.At >= p.IdleTTL }

// Jump steps Redis' clock by d seconds (forward when positive).
func (p *PendingEntries) Jump(d int64) { p.now += d }

// Now is Redis' clock on the model's time line (0 at the start).
func (p *PendingEntries) Now() int64 { return p.now }

// Restart is a restart of Redis on its append-only file (never
// rewritten): the file replays each delivery as an XCLAIM with the
// delivery time it had when it was written, and XCLAIM takes a delivery
// time in the future as now. So after a backward jump the entries
// delivered before it restart their idle time at the restart, and a later
// restart, once the clock passed their written delivery time again, gives
// them that one back (the clamp was never written).
func (p *PendingEntries) Restart() {
	for _, pe := range p.pending {
		pe.At = min(pe.logged, p.now)
	}
}

func (pe *Pending) set(at int64) { pe.At, pe.logged = at, at }

// Add appends request id to the stream.
func (p *PendingEntries) Add(id string) {
	p.unread = append(p.unread, id)
	p.enqueued = append(p.enqueued, id)
}

// Deliver records that consumer got request id as entry: read new (the
// first unread request), or taken over (an idle entry of another consumer,
// its entry id unchanged). It returns an error for a delivery the protocol
// does not allow.
func (p *PendingEntries) Deliver(consumer, id, entry string) error {
	if pe, ok := p.pending[id]; ok {
		switch {
		case pe.Entry != entry:
			return fmt.Errorf("%s got %s as entry %s, but it is pending as %s", consumer, id, entry, pe.Entry)
		case pe.Consumer == consumer:
			return fmt.Errorf("%s got %s (entry %s) a second time while it still owns it", consumer, id, entry)
		case !p.idle(pe):
			return fmt.Errorf("%s took %s (entry %s) over from %s, whose entry was live", consumer, id, entry, pe.Consumer)
		}
		pe.Consumer = consumer
		pe.set(p.now)
		return nil
	}
	if len(p.unread) == 0 || p.unread[0] != id {
		return fmt.Errorf("%s read %s as a new entry; the next unread is %v", consumer, id, p.unread)
	}
	p.unread = p.unread[1:]
	p.pending[id] = &Pending{Entry: entry, Consumer: consumer, At: p.now, logged: p.now}
	return nil
}

func (p *PendingEntries) owns(consumer, id, entry string) bool {
	pe, ok := p.pending[id]
	return ok && pe.Consumer == consumer && pe.Entry == entry
}

// Heartbeat resets the idle time of the entries consumer still owns among
// held (entry -> request; a consumer may hold two entries of one request,
// a stale one and the one it read after the request was handed back).
func (p *PendingEntries) Heartbeat(consumer string, held map[string]string) {
	for entry, id := range held {
		if p.owns(consumer, id, entry) {
			p.pending[id].set(p.now)
		}
	}
}

// Expire makes the entry of request id idle for an hour (XCLAIM ... IDLE):
// idle through every backward jump of less than an hour less IdleTTL. It
// reports whether id was pending.
func (p *PendingEntries) Expire(id string) bool {
	pe, ok := p.pending[id]
	if ok {
		pe.set(p.now - 3600)
	}
	return ok
}

// Settle writes the result of request id delivered to consumer as entry and
// acks it, if consumer still owns that entry; a stale holder writes nothing.
func (p *PendingEntries) Settle(consumer, id, entry string) bool {
	if !p.owns(consumer, id, entry) {
		return false
	}
	delete(p.pending, id)
	p.results[id]++
	return true
}

// HandBack appends request id again as a new entry and acks the old one, if
// consumer still owns it.
func (p *PendingEntries) HandBack(consumer, id, entry string) bool {
	if !p.owns(consumer, id, entry) {
		return false
	}
	delete(p.pending, id)
	p.unread = append(p.unread, id)
	return true
}

// Unread returns the unread requests in stream order.
func (p *PendingEntries) Unread() []string { return slices.Clone(p.unread) }

// PendingOf returns the pending entries by request.
func (p *PendingEntries) PendingOf() map[string]Pending {
	out := make(map[string]Pending, len(p.pending))
	for id, pe := range p.pending {
		c := *pe
		c.Idle, c.logged = p.idle(pe), 0
		out[id] = c
	}
	return out
}

// Results returns how many results each answered request has.
func (p *PendingEntries) Results() map[string]int { return maps(p.results) }

// Unanswered returns the requests without a result.
func (p *PendingEntries) Unanswered() []string {
	var out []string
	for _, id := range p.enqueued {
		if p.results[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// Check verifies the model's invariants: each request in exactly one place,
// at most one result.
func (p *PendingEntries) Check() error {
	unread := map[string]int{}
	for _, id := range p.unread {
		unread[id]++
	}
	for _, id := range p.enqueued {
		_, pe := p.pending[id]
		r := p.results[id]
		if r > 1 {
			return fmt.Errorf("request %s has %d results", id, r)
		}
		places := unread[id] + r
		if pe {
			places++
		}
		if places != 1 {
			return fmt.Errorf("request %s is in %d places (unread %d, pending %v, results %d)", id, places, unread[id], pe, r)
		}
	}
	return nil
}
