package transport

import "context"

// HealthChecker is implemented by transports that can tell whether their
// broker is usable. The core's /readyz endpoint calls it, with a 3 s
// timeout, on every probe while the pipeline runs; a transport without it
// is taken as healthy.
//
// CheckHealth returns nil when the broker serving queues (the deployment's
// request queues) can be reached, and an error saying what failed
// otherwise. It must return by the time ctx ends, be cheap (one round trip,
// e.g. a Redis PING, or one small lookup per queue), have no side effects on
// the broker or on the transport's deliveries, and be safe for concurrent
// use, also with the transport's subscribers and publishers running and
// after Close (when it returns an error).
type HealthChecker interface {
	CheckHealth(ctx context.Context, queues []Queue) error
}
