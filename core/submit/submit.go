// Package submit is the producer seam of sluice's fronts: enqueue requests
// onto a request queue, cancel them, and read their results from a result
// route the caller owns.
//
// A route is a result destination named by the requests themselves
// (wire.Request.ResultQueueName), so the dispatcher writes each result where
// its caller reads, and a caller reads only its own. Routes are durable where
// the transport is: a Reader leases results and Ack removes them, and a
// result leased by a reader that died before Ack is handed out again, so a
// front that resumes a job after a crash reads every result it had not yet
// recorded (at least once: the caller writes idempotently by request id).
//
// A transport with a producer side implements it in its own package
// (transports/<name>) and registers a Factory for it beside its transport
// factory (Registry; cmd/sluice/adapters.go), built from the same transport
// config the dispatcher uses. The conformance suite in core/submit/submittest
// runs against each.
package submit

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Producer puts requests on request queues and opens result routes. It is
// safe for concurrent use.
type Producer interface {
	// Enqueue puts reqs on request queue (its broker name), in one step
	// where the broker allows it. Each request carries its own deadline and
	// its result route (ResultQueueName). On error some of reqs may be
	// queued; enqueueing them again is safe only where the transport
	// refuses duplicate ids, which Capabilities says.
	Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error
	// Cancel cancels what c names on request queue: still-queued requests
	// are removed (or marked so the dispatcher answers them cancelled
	// without dispatching), in-flight ones are aborted by the dispatcher's
	// cancel watch. It returns how many queued requests it removed, -1 when
	// the transport cannot count them.
	Cancel(ctx context.Context, queue string, c transport.Cancellation) (int, error)
	// Results opens route for reading. Several readers of one route share
	// its results (each result goes to one of them).
	Results(ctx context.Context, route string) (Reader, error)
	// Capabilities says what this producer guarantees.
	Capabilities() Capabilities
	// Close releases the producer's clients.
	Close() error
}

// Reader reads one result route.
type Reader interface {
	// Next waits until at least one result is there (or ctx ends) and
	// leases up to a batch of them.
	Next(ctx context.Context) ([]Result, error)
	// Ack removes results for good; until then a result whose lease lapsed
	// is handed out again.
	Ack(ctx context.Context, rs ...Result) error
	// Close stops reading; results leased and not acked are handed out
	// again after their lease.
	Close() error
}

// Result is one leased result.
type Result struct {
	// ID is the request id the result answers ("" when Raw did not decode).
	ID string
	// Raw is the result as the dispatcher wrote it (wire.Result's JSON).
	Raw json.RawMessage
	// Result is Raw decoded; nil when it did not decode (then Err says why).
	Result *wire.Result
	// Err is why Raw did not decode.
	Err error
	// Lease is the adapter's handle for Ack; callers pass it back unchanged.
	Lease any
}

// Capabilities are what a producer's transport guarantees.
type Capabilities struct {
	// Durable: queued requests and unacked results survive a restart of
	// the process that holds them (false for the memory transport).
	Durable bool
	// DedupesIDs: enqueueing a request id that is already queued is a
	// no-op, so a resumed front may enqueue again what it is unsure of.
	DedupesIDs bool
	// Idempotent: the producer is an IdempotentProducer whose submits work
	// in this deployment (the redis-sortedset producer's: flat form, single
	// node).
	Idempotent bool
}

// ReaderOptions configure the Readers a Producer opens; every adapter takes
// them (as its Options).
type ReaderOptions struct {
	// Lease is how long a result handed out by Next stays reserved before
	// it is handed out again (default 60s).
	Lease time.Duration
	// Batch is the most results one Next returns (default: the adapter's).
	Batch int
}

// WithDefaults returns o with what is unset at its default: a lease of 60s
// and batch results per Next.
func (o ReaderOptions) WithDefaults(batch int) ReaderOptions {
	if o.Lease <= 0 {
		o.Lease = time.Minute
	}
	if o.Batch <= 0 {
		o.Batch = batch
	}
	return o
}

// IdempotentProducer is implemented by producers that take idempotent
// submits (upstream's proposal for crash recovery): a caller that crashed
// between its submit and the answer submits again under the same keys and
// learns what was queued, without losing or doubling a request.
type IdempotentProducer interface {
	// SubmitIdempotent puts each reqs[i] on queue under the caller's key
	// keys[i], unless a submit under that key is recorded: then nothing is
	// queued and the first submission is returned (Replayed) when the
	// request has the same identity (SHA-256 of its canonical JSON), or,
	// when it has not, that request's Submission is nil and the returned
	// error wraps ErrIdempotencyConflict naming the key. Records are kept
	// for the producer's configured retention.
	SubmitIdempotent(ctx context.Context, queue string, reqs []*wire.Request, keys []string) ([]*Submission, error)
	// LookupSubmission returns the record of key, or an error wrapping
	// ErrSubmissionNotFound.
	LookupSubmission(ctx context.Context, key string) (*Submission, error)
}

// Submission is the record of the first submit under an idempotency key.
type Submission struct {
	// Key is the caller's idempotency key.
	Key string
	// RequestToken identifies the first submission.
	RequestToken string
	// IdentitySHA256 is the hex SHA-256 of the request's canonical JSON.
	IdentitySHA256 string
	// RequestRoute and ResultRoute are the request queue and the result
	// route of the first submission.
	RequestRoute, ResultRoute string
	// Submitted is when the first submission was recorded.
	Submitted time.Time
	// Replayed says this call found the record and queued nothing.
	Replayed bool
}

// ErrIdempotencyConflict: the key names a different request.
var ErrIdempotencyConflict = errors.New("idempotency key already used by a different request")

// ErrSubmissionNotFound: no record of the key is kept.
var ErrSubmissionNotFound = errors.New("submission not found")

// RouteReopener is implemented by producers whose result routes a
// consumer restarted on its route can reopen (upstream's proposal for
// durable result-route opening): the reader it returns hands out first
// every result still leased on route and not acked (by the consumer's
// earlier incarnation), leased afresh, then reads on as Results' does.
// Each is acked once with Ack. Not for a route other live readers share:
// their leases are taken too.
type RouteReopener interface {
	ReopenResults(ctx context.Context, route string) (Reader, error)
}
