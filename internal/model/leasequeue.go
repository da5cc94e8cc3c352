package model

import (
	"fmt"
	"slices"
)

// LeaseQueue models the redis-sortedset transport's lease/fence protocol on
// one request queue (transports/redissortedset, its scripts in
// internal/keys): requests wait ordered by deadline, a claim moves the first
// of them into claims (upstream's <q>:claimed, <q>:claim-owners,
// <q>:claims-idx) each held under a fresh owner token with a lease, a
// heartbeat renews the leases its owner still holds, a lease runs out, a
// reclaim returns expired claims to the queue (the delivery counts), a settle
// writes the result and drops the claim in one fenced step, a hand-back
// returns the claim to the queue at its old place, and a claim of a request
// delivered more than MaxDeliveries times answers it with an error result.
//
// Invariants (Check):
//   - exactly one result per request id and enqueue: a request has at most
//     one result, ever, and is in exactly one of waiting, claimed or answered;
//   - no two holders of a live lease: a claim has one owner token, and
//     tokens are never reused;
//   - a stale holder writes nothing: a settle or hand-back by a token that no
//     longer owns its claim changes nothing (Settle, HandBack report false);
//   - deadline order within the in-flight window: a claim of n takes the n
//     first waiting requests by (deadline, enqueue order), and a hand-back or
//     reclaim puts a request back at its place.
type LeaseQueue struct {
	// MaxDeliveries is the transport's max_deliveries.
	MaxDeliveries int

	seq        int64
	waiting    map[string]Order
	claims     map[string]*Claim // by request
	deliveries map[string]int    // leases lost so far (the transport's <q>:redeliveries)
	results    map[string]int
	enqueued   []string
	tokens     map[string]bool // every owner token ever bound
}

// Order is a waiting request's place: deadline first, then enqueue order.
type Order struct {
	Deadline int64 // Unix ms
	Seq      int64
}

// Less orders two places.
func (o Order) Less(p Order) bool {
	if o.Deadline != p.Deadline {
		return o.Deadline < p.Deadline
	}
	return o.Seq < p.Seq
}

// Claim is a request in flight: its owner token and whether its lease is
// live (not expired).
type Claim struct {
	Token string
	Live  bool
	order Order
}

// NewLeaseQueue returns an empty queue.
func NewLeaseQueue(maxDeliveries int) *LeaseQueue {
	return &LeaseQueue{MaxDeliveries: maxDeliveries, waiting: map[string]Order{}, claims: map[string]*Claim{},
		deliveries: map[string]int{}, results: map[string]int{}, tokens: map[string]bool{}}
}

// Enqueue adds request id with deadline (Unix ms) behind every earlier
// request of the same deadline.
func (q *LeaseQueue) Enqueue(id string, deadline int64) {
	q.seq++
	q.waiting[id] = Order{Deadline: deadline, Seq: q.seq}
	q.enqueued = append(q.enqueued, id)
}

// Waiting returns the waiting requests in claim order.
func (q *LeaseQueue) Waiting() []string {
	ids := make([]string, 0, len(q.waiting))
	for id := range q.waiting {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		switch {
		case q.waiting[a].Less(q.waiting[b]):
			return -1
		case q.waiting[b].Less(q.waiting[a]):
			return 1
		}
		return 0
	})
	return ids
}

// Claimed is one request a claim takes: GaveUp when it had been delivered
// more than MaxDeliveries times and the claim answered it with an error
// result instead of delivering it.
type Claimed struct {
	ID     string
	GaveUp bool
}

// Claim takes up to n waiting requests in claim order. Those delivered too
// often are answered at once (their result counts); the others are claimed
// and must be bound to their owner tokens with Bind.
func (q *LeaseQueue) Claim(n int) []Claimed {
	ids := q.Waiting()
	if len(ids) > n {
		ids = ids[:n]
	}
	out := make([]Claimed, 0, len(ids))
	for _, id := range ids {
		o := q.waiting[id]
		delete(q.waiting, id)
		if q.deliveries[id]+1 > q.MaxDeliveries {
			q.results[id]++
			out = append(out, Claimed{ID: id, GaveUp: true})
			continue
		}
		q.claims[id] = &Claim{Live: true, order: o}
		out = append(out, Claimed{ID: id})
	}
	return out
}

// Bind records token as the owner of the claim of id (made by Claim). A
// token bound twice is an error: two holders could then write.
func (q *LeaseQueue) Bind(id, token string) error {
	c, ok := q.claims[id]
	if !ok {
		return fmt.Errorf("bind %s: not claimed", id)
	}
	if c.Token != "" {
		return fmt.Errorf("bind %s: already bound to %s", id, c.Token)
	}
	if token == "" || q.tokens[token] {
		return fmt.Errorf("bind %s: owner token %q empty or used before", id, token)
	}
	q.tokens[token] = true
	c.Token = token
	return nil
}

// owns reports whether token owns the claim of id.
func (q *LeaseQueue) owns(id, token string) bool {
	c, ok := q.claims[id]
	return ok && token != "" && c.Token == token
}

// Heartbeat renews the leases of the claims token still owns; it returns
// how many of tokens lost their claim.
func (q *LeaseQueue) Heartbeat(held map[string]string) (lost int) {
	for token, id := range held {
		if q.owns(id, token) {
			q.claims[id].Live = true
		} else {
			lost++
		}
	}
	return lost
}

// Expire lets the lease of id's claim run out (its owner missed its
// heartbeats for a lease's length: paused, partitioned, or its clock
// jumped). It reports whether id was claimed.
func (q *LeaseQueue) Expire(id string) bool {
	c, ok := q.claims[id]
	if ok {
		c.Live = false
	}
	return ok
}

// Reclaim returns every expired claim to the queue at its place; the
// delivery counts. It returns how many.
func (q *LeaseQueue) Reclaim() int {
	n := 0
	for id, c := range q.claims {
		if !c.Live {
			delete(q.claims, id)
			q.waiting[id] = c.order
			q.deliveries[id]++
			n++
		}
	}
	return n
}

// Settle writes the result of id held under token and drops the claim, if
// token still owns it; a stale holder writes nothing (false).
func (q *LeaseQueue) Settle(id, token string) bool {
	if !q.owns(id, token) {
		return false
	}
	delete(q.claims, id)
	q.results[id]++
	return true
}

// HandBack returns the claim of id held under token to the queue at its
// place, if token still owns it (the delivery does not count).
func (q *LeaseQueue) HandBack(id, token string) bool {
	if !q.owns(id, token) {
		return false
	}
	c := q.claims[id]
	delete(q.claims, id)
	q.waiting[id] = c.order
	return true
}

// Claims returns the requests in flight and their claims.
func (q *LeaseQueue) Claims() map[string]Claim {
	out := make(map[string]Claim, len(q.claims))
	for id, c := range q.claims {
		out[id] = *c
	}
	return out
}

// Results returns how many results each answered request has.
func (q *LeaseQueue) Results() map[string]int { return maps(q.results) }

// Deliveries returns the leases each request lost so far.
func (q *LeaseQueue) Deliveries() map[string]int { return maps(q.deliveries) }

// Check verifies the model's own invariants: every enqueued request in
// exactly one of waiting, claimed, answered; at most one result each.
func (q *LeaseQueue) Check() error {
	for _, id := range q.enqueued {
		_, w := q.waiting[id]
		_, c := q.claims[id]
		r := q.results[id]
		if r > 1 {
			return fmt.Errorf("request %s has %d results", id, r)
		}
		places := 0
		for _, b := range []bool{w, c, r == 1} {
			if b {
				places++
			}
		}
		if places != 1 {
			return fmt.Errorf("request %s is in %d places (waiting %v, claimed %v, results %d)", id, places, w, c, r)
		}
	}
	return nil
}

// Unanswered returns the enqueued requests without a result.
func (q *LeaseQueue) Unanswered() []string {
	var out []string
	for _, id := range q.enqueued {
		if q.results[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
