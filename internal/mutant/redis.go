package mutant

// The planted bugs of the Redis sorted-set and stream protocols (docs/verification.md, "Redis
// sorted set and stream"). Each is documented at its call site.
const (
	// SettleNoFence: the sorted-set settle writes the result and removes the lease without
	// checking the lease token, so a stale holder (its lease expired and was reclaimed) still
	// writes a result.
	SettleNoFence Name = "settle-no-fence"
	// AckBeforeResult: the sorted-set settle removes the lease (acks) in one call and writes the
	// result in a second, so a crash between the two loses the result.
	AckBeforeResult Name = "ack-before-result"
	// HeartbeatNoRenew: the sorted-set heartbeat reports success but does not extend the lease,
	// so a live holder's lease runs out and another replica reclaims the request.
	HeartbeatNoRenew Name = "heartbeat-no-renew"
	// RequeueLosesOrder: a hand-back re-adds the member scored by the time of the hand-back
	// instead of its deadline, so it loses its place in deadline order.
	RequeueLosesOrder Name = "requeue-loses-order"
	// TakeoverIgnoresLive: the reclaim of leases treats every lease as expired and takes a
	// request from an owner whose lease is still live.
	TakeoverIgnoresLive Name = "takeover-ignores-live"
	// RetryLosesOrder: a flat request's retry is re-added as the core rewrote it (an envelope
	// without the producer's member tag), so among requests of its deadline it sorts behind
	// every one of them instead of at its place in enqueue order.
	RetryLosesOrder Name = "retry-loses-order"
	// ReclaimIgnoresSettling: the reclaim of expired claims does not look for a cross-slot
	// settling record, so a claim whose owner died (or paused) inside a cross-slot settle goes
	// back to the queue and is dispatched again instead of having its settle finished.
	ReclaimIgnoresSettling Name = "reclaim-ignores-settling"
	// ReclaimReplicaClock: the reclaim selects expired claims by the replica's own clock
	// instead of Redis' (which scores the claim index), so after Redis' clock stepped ahead of
	// the replica's, claims expired by Redis' clock are not returned to the queue.
	ReclaimReplicaClock Name = "reclaim-replica-clock"
	// StreamAckUnowned: the stream transport settles a pending entry without checking that this
	// consumer still owns it, so a consumer whose entry another consumer auto-claimed still
	// writes a result.
	StreamAckUnowned Name = "stream-ack-unowned"
)

// modelArgs bound the state-machine tests the runner runs per mutant.
var modelArgs = []string{"-rapid.checks=100", "-rapid.nofailfile"}

var redisCatalog = []Mutant{
	{Name: SettleNoFence, Doc: "sorted-set settle without the lease-token fence",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: AckBeforeResult, Doc: "sorted-set settle removes the lease before it writes the result (two calls)",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: HeartbeatNoRenew, Doc: "sorted-set heartbeat that stops renewing the lease",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: RequeueLosesOrder, Doc: "hand-back re-ZADDs with the time of the hand-back, losing deadline order",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: TakeoverIgnoresLive, Doc: "reclaim takes over a lease whose owner is still live",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: RetryLosesOrder, Doc: "a flat request's retry loses the member tag that keeps it in enqueue order among equal deadlines",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: ReclaimIgnoresSettling, Doc: "reclaim returns a claim with a cross-slot settle under way to the queue instead of finishing it",
		Packages: []string{"./transports/redissortedset/"}, Run: "^(TestModelSortedSetCrossSlot|TestCrossSlotPausedHolder)$", Args: modelArgs},
	{Name: ReclaimReplicaClock, Doc: "reclaim selects expired claims by the replica's clock, not Redis' (found by the clock-jump steps)",
		Packages: []string{"./transports/redissortedset/"}, Run: "^TestModelSortedSet$", Args: modelArgs},
	{Name: StreamAckUnowned, Doc: "stream settle without checking this consumer still owns the pending entry",
		Packages: []string{"./transports/redisstream/"}, Run: "^TestModelStream$", Args: modelArgs},
}
