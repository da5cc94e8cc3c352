package gate

import (
	"context"
	"time"
)

// EvictionChecker is implemented by gates that can tell, from what they
// read of the pool, whether the calls the pipeline takes back (a queue's
// evict option) leave it. A server that does not watch its connections
// runs an aborted call to its end: taking it back then frees no seat, the
// gate reads the call as other traffic, and the request runs twice. The
// pipeline's evictor asks EvictionState after each measured budget, before
// it takes anything back, and reports what it took back with Evicted.
//
// Both methods are called from the refresh loop's goroutine, right after
// the gate's Budget; they must be cheap and must not block past ctx.
type EvictionChecker interface {
	// EvictionState reports whether calls may be taken back now.
	EvictionState(ctx context.Context) EvictionState
	// Evicted tells the gate that the pipeline just aborted n (> 0) calls
	// the gate admitted, after its last reading.
	Evicted(ctx context.Context, n int)
}

// EvictionState is a gate's answer to "may calls be taken back now?".
type EvictionState struct {
	// Suspended: the pool was seen not to free the calls taken back; the
	// pipeline takes none back until Until (then it tries again).
	Suspended bool
	// Until is when a suspension ends (zero when not suspended).
	Until time.Time
	// Pending: the last calls taken back have not shown on the pool yet;
	// nothing more is taken back until they have, or until the gate
	// judged that they did not (Suspended).
	Pending bool
	// Reason says, for a suspension, what the gate saw (it names the pool
	// and the figures); it is logged and shown on the status page.
	Reason string
}

// EvictionCheckerOf returns g's eviction checker, looking through
// wrappers, or nil.
func EvictionCheckerOf(g Gate) EvictionChecker {
	c, _ := Find[EvictionChecker](g)
	return c
}
