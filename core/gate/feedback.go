package gate

import (
	"net/http"
	"time"
)

// Feedback is what came back from the gateway for one dispatched request:
// the signal a feedback gate (aimd) learns from. A gate receives it through
// the Observe of the Decision that admitted the request.
type Feedback struct {
	// Sent is when the HTTP call started.
	Sent time.Time
	// StatusCode is the gateway's HTTP status; 0 when no complete response
	// came back (a transport failure, a timeout, the request's deadline, a
	// cancellation).
	StatusCode int
	// Header holds the response's headers when a response came back (nil
	// otherwise). It is shared: read it, never change it.
	Header http.Header
	// RetryAfter is the response's Retry-After (delay seconds or HTTP-date),
	// 0 when absent, unparsable or in the past.
	RetryAfter time.Duration
	// Err says why the call did not succeed; nil on a 2xx answer.
	Err error
}

// JoinObservers returns one Observe calling each of fs in order; nil when
// there is none. A nil member is skipped.
func JoinObservers(fs ...func(Feedback)) func(Feedback) {
	var kept []func(Feedback)
	for _, f := range fs {
		if f != nil {
			kept = append(kept, f)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return func(fb Feedback) {
		for _, f := range kept {
			f(fb)
		}
	}
}
