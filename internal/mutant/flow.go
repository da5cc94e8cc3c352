package mutant

// The planted bugs of quotas, credits and cancellation (docs/verification.md, "Quotas, credits
// and cancellation"). Each is documented at its call site.
const (
	// QuotaReleaseTwice: the redis-quota gate's Release is not once-only and its release
	// script decrements the counter whether or not the lease was still held, so a second
	// Release of one admission gives a slot back twice.
	QuotaReleaseTwice Name = "quota-release-twice"
	// CancelOnlyAtClaim: the pipeline checks a request's cancellation once, when it is taken
	// from the queue, and not again right before dispatch, so a cancel that lands while the
	// request waits (for a gate or a worker) is not honoured.
	CancelOnlyAtClaim Name = "cancel-only-at-claim"
	// CreditNotReturnedOnHandBack: a message handed back to its queue (not settled) keeps its
	// claim credit, so every hand-back shrinks the queue's in-flight window for good.
	CreditNotReturnedOnHandBack Name = "credit-not-returned-on-hand-back"
)

// flowArgs bound the model tests the runner starts per mutant.
var flowArgs = []string{"-rapid.checks=100", "-rapid.nofailfile"}

var flowCatalog = []Mutant{
	{Name: QuotaReleaseTwice, Doc: "redis-quota Release not once-only, its script decrementing without the lease",
		Packages: []string{"./gates/redisquota/"}, Run: "^TestModelQuota$", Args: flowArgs},
	{Name: CancelOnlyAtClaim, Doc: "cancellation checked when the request is claimed, not again before dispatch",
		Packages: []string{"./core/pipeline/"}, Run: "^TestModelCancel$", Args: flowArgs},
	{Name: CreditNotReturnedOnHandBack, Doc: "a handed-back message keeps its claim credit",
		Packages: []string{"./core/transport/"}, Run: "^TestModelCredits$", Args: flowArgs},
}
