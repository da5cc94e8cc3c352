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
// returns the claim to the queue at its old place, a requeue (a retry)
// swaps the claim for an entry of the delay set that goes back to the queue
// at its old place once due, and a claim of a request delivered more than
// MaxDeliveries times answers it with an error result.
//
// Time is Redis' clock, in whole seconds of the model's own: it moves only
// by Jump (the server's wall clock stepped forward or back). A lease expires
// LeaseTTL after the claim, heartbeat or prepare that last set it, and is
// live while its expiry is after now; a retry is due once its due time is
// not after now. So a forward jump past a lease's expiry expires it, and a
// backward one makes an expired lease (not yet reclaimed) live again and
// a due retry not due.
//
// The cross-slot settle (a result list in another hash slot than the
// claims, transports/redissortedset/xslot.go) is three steps: Prepare (the
// fenced settling record beside the claim; the lease renewed), Push (the
// result, once per settle) and Commit (the claim dropped). A claim with a
// settling record of its owner is never handed back or requeued, and a
// reclaim that finds its lease expired finishes the settle (Push, Commit)
// instead of returning the request to the queue.
//
// Invariants (Check):
//   - exactly one result per request id and enqueue: a request has at most
//     one result, ever, and is in exactly one of waiting, delayed (a retry
//     not due yet), claimed or answered — except that a cross-slot settle
//     pushed but not yet committed is both claimed and answered;
//   - no two holders of a live lease: a claim has one owner token, and
//     tokens are never reused;
//   - a stale holder writes nothing: a settle or hand-back by a token that no
//     longer owns its claim changes nothing (Settle, HandBack report false);
//   - deadline order within the in-flight window: a claim of n takes the n
//     first waiting requests by (deadline, enqueue order), and a hand-back,
//     reclaim or requeue puts a request back at its place.
type LeaseQueue struct {
	// MaxDeliveries is the transport's max_deliveries.
	MaxDeliveries int
	// LeaseTTL is the lease length in the model's seconds (lease_ms/1000).
	LeaseTTL int64

	now        int64 // Redis' clock, moved by Jump
	seq        int64
	waiting    map[string]Order
	delayed    map[string]*Delayed
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
// live (its expiry after now).
type Claim struct {
	Token string
	Live  bool // in Claims' snapshots; the model keeps expiry
	// Expiry is the lease's expiry on the model's clock.
	Expiry int64
	// Settling is set by Prepare (a cross-slot settle under way), Pushed
	// once its result is in the result list.
	Settling, Pushed bool
	order            Order
}

// Delayed is a requeued request waiting in the delay set: due once its
// delay ran out (At not after now, by Redis' clock), when the next claim
// moves it back to the queue at its place.
type Delayed struct {
	At    int64 // the due time on the model's clock
	order Order
}

// never is a time no backward jump reaches: a lease or delay set to it
// stays expired or due.
const never = -1 << 60

// NewLeaseQueue returns an empty queue with leases of ten minutes.
func NewLeaseQueue(maxDeliveries int) *LeaseQueue {
	return &LeaseQueue{MaxDeliveries: maxDeliveries, LeaseTTL: 600, waiting: map[string]Order{}, delayed: map[string]*Delayed{}, claims: map[string]*Claim{},
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

// Claim moves the due retries back to the queue at their places, then takes
// up to n waiting requests in claim order. Those delivered too often are
// answered at once (their result counts); the others are claimed and must
// be bound to their owner tokens with Bind.
func (q *LeaseQueue) Claim(n int) []Claimed {
	for id, d := range q.delayed {
		if d.At <= q.now {
			delete(q.delayed, id)
			q.waiting[id] = d.order
		}
	}
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
		q.claims[id] = &Claim{Expiry: q.now + q.LeaseTTL, order: o}
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
			q.claims[id].Expiry = q.now + q.LeaseTTL
		} else {
			lost++
		}
	}
	return lost
}

// Expire lets the lease of id's claim run out (its owner missed its
// heartbeats for a lease's length: paused or partitioned): its expiry is
// set to a second before now. It reports whether id was claimed.
func (q *LeaseQueue) Expire(id string) bool {
	c, ok := q.claims[id]
	if ok {
		c.Expiry = q.now - 1
	}
	return ok
}

// ExpireForGood sets the lease of id's claim so far into the past that no
// backward jump makes it live again (the end of a run).
func (q *LeaseQueue) ExpireForGood(id string) bool {
	c, ok := q.claims[id]
	if ok {
		c.Expiry = never
	}
	return ok
}

// Jump steps Redis' clock by d seconds (forward when positive): the
// leases and delays it passes expire or fall due, and a backward step
// makes those it passes back live or not due.
func (q *LeaseQueue) Jump(d int64) { q.now += d }

// Now is Redis' clock on the model's time line (0 at the start).
func (q *LeaseQueue) Now() int64 { return q.now }

func (c *Claim) live(now int64) bool { return c.Expiry > now }

// Reclaim returns every expired claim to the queue at its place; the
// delivery counts. An expired claim with a settle under way is finished
// instead (its result pushed if it was not, the claim dropped). It returns
// how many were returned to the queue.
func (q *LeaseQueue) Reclaim() int {
	n := 0
	for id, c := range q.claims {
		live := c.live(q.now)
		if !live && c.Settling {
			if !c.Pushed {
				q.results[id]++
			}
			delete(q.claims, id)
			continue
		}
		if !live {
			delete(q.claims, id)
			q.waiting[id] = c.order
			q.deliveries[id]++
			n++
		}
	}
	return n
}

// Settle writes the result of id held under token and drops the claim, if
// token still owns it; a stale holder writes nothing (false). It is the
// one-script settle, and a cross-slot settle whose three steps all ran.
func (q *LeaseQueue) Settle(id, token string) bool {
	if !q.owns(id, token) {
		return false
	}
	if c := q.claims[id]; !c.Pushed {
		q.results[id]++
	}
	delete(q.claims, id)
	return true
}

// Prepare is the first step of a cross-slot settle: if token still owns
// the claim of id, its settling record is written and its lease renewed.
// It reports whether the settle goes on (a stale holder's stops here).
func (q *LeaseQueue) Prepare(id, token string) bool {
	if !q.owns(id, token) {
		return false
	}
	c := q.claims[id]
	c.Settling, c.Expiry = true, q.now+q.LeaseTTL
	return true
}

// Push is the second step of a cross-slot settle prepared by token: the
// result is pushed unless this settle pushed it already. A settle that
// lost its claim since (a reclaimer finished it) pushes nothing: the
// marker of the first push is there.
func (q *LeaseQueue) Push(id, token string) {
	if !q.owns(id, token) {
		return
	}
	c := q.claims[id]
	if c.Settling && !c.Pushed {
		c.Pushed = true
		q.results[id]++
	}
}

// Commit is the last step of a cross-slot settle: the claim is dropped if
// token still owns it and its result was pushed.
func (q *LeaseQueue) Commit(id, token string) {
	if q.owns(id, token) && q.claims[id].Pushed {
		delete(q.claims, id)
	}
}

// HandBack returns the claim of id held under token to the queue at its
// place, if token still owns it and no settle of it is under way (the
// delivery does not count).
func (q *LeaseQueue) HandBack(id, token string) bool {
	if !q.owns(id, token) || q.claims[id].Settling {
		return false
	}
	c := q.claims[id]
	delete(q.claims, id)
	q.waiting[id] = c.order
	return true
}

// RequeueResult is what Requeue did.
type RequeueResult int

// Requeue outcomes, as the transport's script returns them.
const (
	RequeueLost     RequeueResult = 0 // token no longer owns the claim: nothing changes
	RequeueDone     RequeueResult = 1 // the claim is now an entry of the delay set
	RequeueSettling RequeueResult = 2 // a cross-slot settle of it is under way: left alone
)

// Requeue swaps the claim of id held under token for an entry of the delay
// set (a retry), due at once (now) when due is set, else in LeaseTTL; the request goes back to the
// queue at its place, and its lost leases are forgotten (the retry count
// travels with the message instead).
func (q *LeaseQueue) Requeue(id, token string, due bool) RequeueResult {
	if !q.owns(id, token) {
		return RequeueLost
	}
	c := q.claims[id]
	if c.Settling {
		return RequeueSettling
	}
	delete(q.claims, id)
	delete(q.deliveries, id)
	at := q.now + q.LeaseTTL
	if due {
		at = q.now
	}
	q.delayed[id] = &Delayed{At: at, order: c.order}
	return RequeueDone
}

// MakeDue lets the delay of id's retry run out for good (its due time
// moved to the epoch: no backward jump makes it wait again). It reports
// whether id was in the delay set.
func (q *LeaseQueue) MakeDue(id string) bool {
	d, ok := q.delayed[id]
	if ok {
		d.At = never
	}
	return ok
}

// DelayedIDs returns the requests in the delay set and whether each is due.
func (q *LeaseQueue) DelayedIDs() map[string]bool {
	out := make(map[string]bool, len(q.delayed))
	for id, d := range q.delayed {
		out[id] = d.At <= q.now
	}
	return out
}

// Claims returns the requests in flight and their claims.
func (q *LeaseQueue) Claims() map[string]Claim {
	out := make(map[string]Claim, len(q.claims))
	for id, c := range q.claims {
		cc := *c
		cc.Live = c.live(q.now)
		out[id] = cc
	}
	return out
}

// Results returns how many results each answered request has.
func (q *LeaseQueue) Results() map[string]int { return maps(q.results) }

// Deliveries returns the leases each request lost so far.
func (q *LeaseQueue) Deliveries() map[string]int { return maps(q.deliveries) }

// Check verifies the model's own invariants: every enqueued request in
// exactly one of waiting, delayed, claimed, answered (a pushed cross-slot
// settle counts its claim and result as one); at most one result each; a
// pushed settle has its result; owner tokens unique.
func (q *LeaseQueue) Check() error {
	owners := map[string]string{}
	for _, id := range q.enqueued {
		_, w := q.waiting[id]
		_, d := q.delayed[id]
		cl, c := q.claims[id]
		r := q.results[id]
		if r > 1 {
			return fmt.Errorf("request %s has %d results", id, r)
		}
		answered := r == 1
		if c && cl.Pushed {
			if !answered {
				return fmt.Errorf("request %s: its settle pushed a result, and it has none", id)
			}
			answered = false // the claim and its result are one place until the commit
		}
		places := 0
		for _, b := range []bool{w, d, c, answered} {
			if b {
				places++
			}
		}
		if places != 1 {
			return fmt.Errorf("request %s is in %d places (waiting %v, delayed %v, claimed %v, results %d)", id, places, w, d, c, r)
		}
		if c && cl.Token != "" {
			if other, dup := owners[cl.Token]; dup {
				return fmt.Errorf("owner token %s holds %s and %s", cl.Token, other, id)
			}
			owners[cl.Token] = id
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
