package model

import "testing"

// TestLeaseQueueFence walks the stale-holder interleaving: a lease runs out,
// the request is reclaimed and claimed again; the first holder's settle and
// hand-back change nothing, the second holder's settle answers once.
func TestLeaseQueueFence(t *testing.T) {
	q := NewLeaseQueue(3)
	q.Enqueue("a", 2000)
	q.Enqueue("b", 1000)
	q.Enqueue("c", 1000)
	if got := q.Waiting(); got[0] != "b" || got[1] != "c" || got[2] != "a" {
		t.Fatalf("claim order %v, want [b c a] (deadline, then enqueue order)", got)
	}
	if c := q.Claim(1); len(c) != 1 || c[0].ID != "b" {
		t.Fatalf("claim %v", c)
	}
	if err := q.Bind("b", "t1"); err != nil {
		t.Fatal(err)
	}
	q.Expire("b")
	if n := q.Reclaim(); n != 1 {
		t.Fatalf("reclaimed %d", n)
	}
	q.Claim(1)
	if err := q.Bind("b", "t1"); err == nil {
		t.Fatal("an owner token bound twice")
	}
	if err := q.Bind("b", "t2"); err != nil {
		t.Fatal(err)
	}
	if q.Settle("b", "t1") || q.HandBack("b", "t1") {
		t.Fatal("a stale holder wrote")
	}
	if !q.Settle("b", "t2") || q.Settle("b", "t2") {
		t.Fatal("the holder's settle must answer exactly once")
	}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
	if r := q.Results(); r["b"] != 1 || q.Deliveries()["b"] != 1 {
		t.Fatalf("results %v deliveries %v", r, q.Deliveries())
	}
}

// TestLeaseQueueGiveUp: a request delivered more than MaxDeliveries times is
// answered by the claim.
func TestLeaseQueueGiveUp(t *testing.T) {
	q := NewLeaseQueue(1)
	q.Enqueue("a", 1)
	q.Claim(1)
	_ = q.Bind("a", "t1")
	q.Expire("a")
	q.Reclaim()
	if c := q.Claim(1); len(c) != 1 || !c[0].GaveUp {
		t.Fatalf("claim %v, want a give-up", c)
	}
	if q.Results()["a"] != 1 || q.Check() != nil {
		t.Fatalf("results %v, check %v", q.Results(), q.Check())
	}
}

// TestPendingEntriesTakeover: a live entry cannot be taken over, an idle one
// can, and the stale consumer then writes nothing.
func TestPendingEntriesTakeover(t *testing.T) {
	p := NewPendingEntries()
	p.Add("a")
	p.Add("b")
	if err := p.Deliver("c1", "b", "2-0"); err == nil {
		t.Fatal("read out of stream order")
	}
	if err := p.Deliver("c1", "a", "1-0"); err != nil {
		t.Fatal(err)
	}
	if err := p.Deliver("c2", "a", "1-0"); err == nil {
		t.Fatal("took over a live entry")
	}
	p.Expire("a")
	if err := p.Deliver("c2", "a", "1-0"); err != nil {
		t.Fatal(err)
	}
	if p.Settle("c1", "a", "1-0") || p.HandBack("c1", "a", "1-0") {
		t.Fatal("a stale consumer wrote")
	}
	if !p.HandBack("c2", "a", "1-0") {
		t.Fatal("the owner's hand-back failed")
	}
	if u := p.Unread(); len(u) != 2 || u[0] != "b" || u[1] != "a" {
		t.Fatalf("unread %v, want [b a]", u)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseQueueRequeue: a retry waits in the delay set, comes back at its
// place once due, forgets its lost leases, and a stale holder's requeue
// changes nothing.
func TestLeaseQueueRequeue(t *testing.T) {
	q := NewLeaseQueue(2)
	q.Enqueue("a", 1000)
	q.Enqueue("b", 1000)
	q.Claim(1)
	_ = q.Bind("a", "t1")
	q.Expire("a")
	q.Reclaim() // a lost one lease
	q.Claim(1)
	_ = q.Bind("a", "t2")
	if q.Requeue("a", "t1", true) != RequeueLost {
		t.Fatal("a stale holder requeued")
	}
	if q.Requeue("a", "t2", false) != RequeueDone {
		t.Fatal("the holder's requeue failed")
	}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
	if c := q.Claim(5); len(c) != 1 || c[0].ID != "b" {
		t.Fatalf("claim %v: a retry not due came back", c)
	}
	_ = q.Bind("b", "t3")
	q.HandBack("b", "t3")
	q.MakeDue("a")
	if c := q.Claim(1); len(c) != 1 || c[0].ID != "a" {
		t.Fatalf("claim %v, want a (its deadline ties b's, enqueued first)", c)
	}
	_ = q.Bind("a", "t4")
	q.Expire("a")
	q.Reclaim()
	if c := q.Claim(1); len(c) != 1 || c[0].GaveUp {
		t.Fatalf("claim %v: a lost two leases, one before its retry that forgot it", c)
	}
	if err := q.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseQueueCrossSlot: a settle prepared and then abandoned is finished
// by the reclaim, once, and the abandoned holder's later steps write
// nothing; a settle under way is neither handed back nor requeued.
func TestLeaseQueueCrossSlot(t *testing.T) {
	q := NewLeaseQueue(3)
	q.Enqueue("a", 1)
	q.Enqueue("b", 2)
	q.Claim(2)
	_ = q.Bind("a", "t1")
	_ = q.Bind("b", "t2")
	if !q.Prepare("a", "t1") || q.HandBack("a", "t1") || q.Requeue("a", "t1", true) != RequeueSettling {
		t.Fatal("a settle under way was handed back or requeued")
	}
	q.Push("a", "t1")
	q.Push("a", "t1")
	if err := q.Check(); err != nil || q.Results()["a"] != 1 {
		t.Fatalf("after the push: %v, results %v", err, q.Results())
	}
	q.Expire("a")
	if q.Reclaim() != 0 || len(q.Claims()) != 1 || q.Results()["a"] != 1 {
		t.Fatalf("the reclaim did not finish the pushed settle: claims %v results %v", q.Claims(), q.Results())
	}
	q.Prepare("b", "t2")
	q.Expire("b")
	q.Reclaim()
	q.Push("b", "t2")
	q.Commit("b", "t2")
	if err := q.Check(); err != nil || q.Results()["b"] != 1 || len(q.Claims()) != 0 {
		t.Fatalf("%v: results %v claims %v", err, q.Results(), q.Claims())
	}
}

// TestLeaseQueueClockJumps: a forward jump past the lease expires it and
// makes a delayed retry due; a backward jump before a reclaim makes the
// lease live again and the retry wait again; a reclaimed claim stays gone.
func TestLeaseQueueClockJumps(t *testing.T) {
	q := NewLeaseQueue(3)
	q.Enqueue("a", 1)
	q.Enqueue("b", 2)
	q.Claim(2)
	_ = q.Bind("a", "t1")
	_ = q.Bind("b", "t2")
	if q.Requeue("b", "t2", false) != RequeueDone || q.DelayedIDs()["b"] {
		t.Fatal("the retry of b must wait a lease's length")
	}
	q.Jump(q.LeaseTTL + 300)
	if q.Claims()["a"].Live || !q.DelayedIDs()["b"] {
		t.Fatalf("after a forward jump past the lease: claims %v, delayed %v", q.Claims(), q.DelayedIDs())
	}
	q.Jump(-600)
	if !q.Claims()["a"].Live || q.DelayedIDs()["b"] {
		t.Fatalf("after a backward jump: claims %v, delayed %v", q.Claims(), q.DelayedIDs())
	}
	if q.Reclaim() != 0 {
		t.Fatal("a lease live again was reclaimed")
	}
	q.Jump(600)
	if q.Reclaim() != 1 || q.Settle("a", "t1") {
		t.Fatal("the expired claim must be reclaimed and its stale holder write nothing")
	}
	q.Jump(-900)
	if _, ok := q.Claims()["a"]; ok || q.Check() != nil {
		t.Fatalf("a backward jump brought a reclaimed claim back: %v, %v", q.Claims(), q.Check())
	}
	q.MakeDue("b")
	if !q.DelayedIDs()["b"] {
		t.Fatal("MakeDue must hold through backward jumps")
	}
}

// TestPendingEntriesClockJumps: an entry goes idle when Redis' clock passes
// claim_idle_ms after its delivery, live again when it steps back; a Redis
// restart after a backward jump restarts the idle time of the entries
// delivered in the future of the new clock.
func TestPendingEntriesClockJumps(t *testing.T) {
	p := NewPendingEntries()
	p.Add("a")
	if err := p.Deliver("c1", "a", "e1"); err != nil {
		t.Fatal(err)
	}
	p.Jump(p.IdleTTL)
	if !p.PendingOf()["a"].Idle {
		t.Fatal("an entry delivered claim_idle_ms ago must be idle")
	}
	p.Jump(-300)
	if p.PendingOf()["a"].Idle || p.Deliver("c2", "a", "e1") == nil {
		t.Fatal("after a backward jump the entry is live and cannot be taken over")
	}
	p.Jump(-600) // 300 s before its delivery
	p.Restart()
	p.Jump(p.IdleTTL)
	if !p.PendingOf()["a"].Idle {
		t.Fatal("after a restart the idle time counts from the restart")
	}
	// 300 s after the written delivery time (0): a second restart gives
	// it back, since the first one's clamp was never written.
	p.Restart()
	if got := p.PendingOf()["a"]; got.Idle || got.At != 0 {
		t.Fatalf("after a second restart: %+v, want the written delivery time 0, not idle", got)
	}
	p.Jump(p.IdleTTL)
	if err := p.Deliver("c2", "a", "e1"); err != nil {
		t.Fatal(err)
	}
}
