// Package gate holds the dispatch-gate contract and the machinery that turns a
// gate's budget into credits.
//
// A Gate answers one question, off the per-message path: how much of the pool
// may batch traffic use right now, as a budget in [0,1]. One Refresher loop per
// gate instance asks it periodically and fans the answer out to every queue
// that uses the gate; each queue's Credits turn the budget into an in-flight
// limit ceil(max_concurrency × budget), released along a bounded ramp when it
// rises. Transports claim new messages only while credits are free.
//
// Gates that decide per request (tenant quotas, plugins) also implement
// Admitter; the pipeline calls Admit once per request just before dispatch.
// A gate that learns from the gateway's answers (aimd) returns an Observe
// with its admission: the pipeline hands it the Feedback of the HTTP call.
//
// Implementations live in gates/ (and plugins/host for out-of-process gates);
// this package never imports them. cmd/sluice registers them explicitly in a
// Registry.
package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// Gate reports the share of the pool that batch traffic may use.
//
// Budget must return a value in [0,1] (the Refresher clamps anything else and
// counts it as a gate error) or an error when the gate cannot tell; what an
// error means (open, closed, keep the last value) is the gate's FailurePolicy.
// Budget may do I/O and must honour ctx. It is called from one goroutine at a
// time per gate, but a gate must still be safe for concurrent use because
// Admit and Close may run alongside it. If the gate holds resources it also
// implements io.Closer; Close must be idempotent.
type Gate interface {
	Budget(ctx context.Context) (float64, error)
}

// Admitter is implemented by gates that also decide per request. Admit is on
// the per-message path: keep it cheap, and never block past ctx.
//
// Admit may label the request (req.SetLabel, req.SetClassification): the
// labels travel with the message and survive a re-queue. A gate that
// reserves something for an admitted request returns the way to give it
// back in Decision.Release; a gate that does not admit must not hold
// anything (a chain of gates gives back what its earlier members reserved:
// see Chain).
type Admitter interface {
	Admit(ctx context.Context, req *wire.Request) (Decision, error)
}

// Verdict is the outcome of a per-request admission.
type Verdict int

const (
	// Admit lets the request through now.
	Admit Verdict = iota
	// Defer puts the request back for Decision.Delay without counting an attempt.
	Defer
	// Reject ends the request with a GATE_DROPPED result carrying
	// Decision.Reason, or with Decision.Result when set.
	Reject
	// Wait keeps the request in flight (its credit held) and asks again when
	// capacity frees: on a release in its queue or pool, on a budget change,
	// or after at most Decision.Delay (default 1s), until its deadline or the
	// request timeout ends it with DEADLINE_EXCEEDED. Upstream's Wait.
	Wait
)

// String returns the verdict's lower-case name, as used in metric labels.
func (v Verdict) String() string {
	switch v {
	case Admit:
		return "admit"
	case Defer:
		return "defer"
	case Reject:
		return "reject"
	case Wait:
		return "wait"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Decision is what Admit returns.
type Decision struct {
	Verdict Verdict
	// Delay is how long to wait before asking again (Defer: before the
	// request is delivered again; Wait: the longest wait before asking again).
	Delay time.Duration
	// Reason explains a Defer, Reject or Wait; it ends up in logs and results.
	Reason string
	// Result, for Reject, is the result to write instead of GATE_DROPPED
	// (upstream's tier-priority-admission answers 429 this way); the
	// pipeline sets its id and metadata from the request.
	Result *wire.Result
	// Release, for Admit, gives back what the gate reserved for the request
	// (a quota slot, a concurrency slot). The pipeline calls it exactly once,
	// when the request ends: its result written, or it re-queued or handed
	// back. nil: nothing was reserved.
	Release func()
	// Observe, for Admit, is how a gate learns what the gateway answered
	// (a feedback gate such as aimd sizes its windows from it). The
	// pipeline calls it at most once, when the request it admitted was
	// dispatched, with the answer (or the failure to get one), before
	// Release; a request that ended before its HTTP call (a later gate
	// refused it, its deadline passed) is not observed. It runs on the
	// per-message path: keep it cheap and never block. Gates that wrap
	// others pass their inner gates' Observe on (Chain joins them). nil:
	// the gate does not learn from answers.
	Observe func(Feedback)
	// Pod, for Admit, is the base URL of the pod the gate placed the
	// request on (a gate that knows the pool's pods and dispatches to them
	// itself, such as pool-headroom with dispatch "pods"): the pipeline
	// sends the request there, on the queue's path, instead of to the
	// queue's gateway, and takes it back from there (PodReporter's limits). "": the
	// queue's gateway.
	Pod string
}

// Admitted is the decision that lets a request through.
var Admitted = Decision{Verdict: Admit}

// FailurePolicy says what a failed budget query means.
type FailurePolicy string

const (
	// FailOpen treats a failed query as budget 1.
	FailOpen FailurePolicy = "open"
	// FailClosed treats a failed query as budget 0.
	FailClosed FailurePolicy = "closed"
	// FailKeepLast keeps the last good budget (closed when there was none).
	FailKeepLast FailurePolicy = "keep-last"
)

// ParseFailurePolicy validates a policy name.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch p := FailurePolicy(s); p {
	case FailOpen, FailClosed, FailKeepLast:
		return p, nil
	}
	return "", fmt.Errorf("unknown failure policy %q (want open, closed or keep-last)", s)
}

// PolicyReporter is implemented by gates whose failures do not mean "closed"
// (the default). The Refresher asks once, at start.
type PolicyReporter interface {
	FailurePolicy() FailurePolicy
}

// Intervaler is implemented by gates that want a refresh interval other than
// the Refresher's default.
type Intervaler interface {
	RefreshInterval() time.Duration
}

// Describer is implemented by gates that can say, in one line, when they close
// (for example "closes when saturation ≥ 0.8 on pool p"); it is logged at start.
type Describer interface {
	Describe() string
}

// Validator is implemented by gates that can tell, without their backend,
// that they cannot work: a file they read that is missing, a plugin binary
// that is not executable. `sluice validate` (core/app.Check) asks it of every
// gate it builds; serve does not (a file may appear before the first query).
type Validator interface {
	Validate() error
}

// ValidateGate returns what g's Validator reports, looking through wrappers
// (a gate with an Unwrap() Gate method); nil when none reports anything.
func ValidateGate(g Gate) error {
	if v, ok := Find[Validator](g); ok {
		return v.Validate()
	}
	return nil
}

// Find returns the first of g and the gates it wraps (through their
// Unwrap() Gate methods) that implements T, the optional interface asked
// for; ok is false when none does.
func Find[T any](g Gate) (t T, ok bool) {
	for g != nil {
		if t, ok = g.(T); ok {
			return t, true
		}
		u, isWrapper := g.(interface{ Unwrap() Gate })
		if !isWrapper {
			break
		}
		g = u.Unwrap()
	}
	return t, false
}
