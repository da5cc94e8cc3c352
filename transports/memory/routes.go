package memory

import (
	"cmp"
	"slices"
	"time"
)

// RoutesResults implements transport.ResultRouter: a result list is any
// name, so a request may name its own (wire.Request.ResultQueueName) and
// its caller reads only its own results (Producer).
func (*Transport) RoutesResults() {}

// resultEntry is one result in a list; seq orders the list.
type resultEntry struct {
	seq     uint64
	payload []byte
}

// leasedEntry is a result handed out by LeaseResults and not yet acked.
type leasedEntry struct {
	resultEntry
	until int64 // Unix ns: when the lease lapses
}

// resultList is one result destination: results not leased, oldest
// first, and those leased.
type resultList struct {
	ready  []resultEntry
	leased map[uint64]leasedEntry
}

func (l *resultList) len() int {
	if l == nil {
		return 0
	}
	return len(l.ready) + len(l.leased)
}

// all returns every payload, oldest first.
func (l *resultList) all() [][]byte {
	if l == nil {
		return nil
	}
	es := append([]resultEntry(nil), l.ready...)
	for _, e := range l.leased {
		es = append(es, e.resultEntry)
	}
	slices.SortFunc(es, func(a, b resultEntry) int { return cmp.Compare(a.seq, b.seq) })
	out := make([][]byte, len(es))
	for i, e := range es {
		out[i] = e.payload
	}
	return out
}

// LeasedResult is one result handed out by LeaseResults.
type LeasedResult struct {
	// Token names the lease for AckResults.
	Token uint64
	// Payload is the result as the dispatcher wrote it.
	Payload []byte
}

// LeaseResults hands out up to n results of list topic, oldest first, each
// reserved for lease: a result not acked (AckResults) by then is handed
// out again. It returns none when there are none, and a channel closed at
// the next publish, to wait for more without polling (a lapsing lease does
// not close it: wait at most until the lease of what you hold lapses).
func (t *Transport) LeaseResults(topic string, n int, lease time.Duration) ([]LeasedResult, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.results[topic]
	if l == nil {
		return nil, t.notify
	}
	now := time.Now().UnixNano()
	var lapsed []resultEntry
	for tok, e := range l.leased {
		if e.until <= now {
			delete(l.leased, tok)
			lapsed = append(lapsed, e.resultEntry)
		}
	}
	if len(lapsed) > 0 {
		slices.SortFunc(lapsed, func(a, b resultEntry) int { return cmp.Compare(a.seq, b.seq) })
		l.ready = append(lapsed, l.ready...)
	}
	k := min(n, len(l.ready))
	if k <= 0 {
		return nil, t.notify
	}
	if l.leased == nil {
		l.leased = map[uint64]leasedEntry{}
	}
	out := make([]LeasedResult, k)
	until := now + lease.Nanoseconds()
	for i, e := range l.ready[:k] {
		l.leased[e.seq] = leasedEntry{resultEntry: e, until: until}
		out[i] = LeasedResult{Token: e.seq, Payload: e.payload}
	}
	clear(l.ready[:k])
	l.ready = l.ready[k:]
	return out, t.notify
}

// AckResults removes leased results of list topic for good. A token whose
// lease lapsed and was handed out again is still removed (the result was
// recorded by whoever acks it); an unknown token is ignored.
func (t *Transport) AckResults(topic string, tokens ...uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.results[topic]
	if l == nil {
		return
	}
	var again map[uint64]bool
	for _, tok := range tokens {
		if _, ok := l.leased[tok]; ok {
			delete(l.leased, tok)
			continue
		}
		if again == nil {
			again = map[uint64]bool{}
		}
		again[tok] = true
	}
	if len(again) > 0 {
		l.ready = slices.DeleteFunc(l.ready, func(e resultEntry) bool { return again[e.seq] })
	}
	if l.len() == 0 {
		delete(t.results, topic)
	}
}
