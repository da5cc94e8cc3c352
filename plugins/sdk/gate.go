package sdk

import (
	"context"
	"fmt"
	"time"
)

// Gate is what a plugin implements: the share of the pool that batch
// traffic may use right now.
//
// Budget returns a value in [0,1], or an error when the gate cannot tell
// (sluice then applies the queue's failure policy, closed by default). To
// apply a fallback of its own, a gate returns a *FallbackError: sluice uses
// its budget and still counts the failure. Budget is called by one refresh
// loop per gate (every refresh_interval, 100 ms by default), concurrently
// with Admit: a gate must be safe for concurrent use. ctx carries sluice's
// deadline across the process boundary; honour it.
type Gate interface {
	Budget(ctx context.Context) (float64, error)
}

// Admitter is implemented by gates that also decide per request. Admit is
// called once per request, just before dispatch, only when the queue sets
// gate_params.admit to "true". It is on the per-message path: answer from
// memory and never block past ctx. Admit may label the request
// (Request.SetLabel); the labels travel with it.
type Admitter interface {
	Admit(ctx context.Context, req *Request) (Decision, error)
}

// Describer is implemented by gates that can say, in one line, when they
// close; sluice logs it at start.
type Describer interface {
	Describe() string
}

// Configurer is implemented by gates that take parameters. Configure is
// called once per process, before Budget and Admit, with every gate_params
// entry sluice does not read itself (see docs/plugins.md). It returns an
// error for an invalid value; the SDK reports every parameter Configure
// never read as unknown, so Configure need not call Params.Unused. A gate
// without Configure accepts no parameters.
type Configurer interface {
	Configure(params Params) error
}

// Request is what Admit sees of a request: everything but its payload.
type Request struct {
	// ID identifies the request.
	ID string
	// Created is when the producer created it (zero when unknown).
	Created time.Time
	// Deadline is when its result stops being useful (zero when unknown).
	Deadline time.Time
	// Metadata is the producer's correlation data (job_id, tenant, ...).
	Metadata map[string]string
	// Headers are the headers it forwards to the gateway.
	Headers map[string]string
	// Endpoint is its path override, if any.
	Endpoint string
	// RetryCount is the number of earlier attempts.
	RetryCount int
	// Labels are the labels it carries (tier, classification, ...); read
	// them with Label, change them with SetLabel.
	Labels map[string]string

	// changed holds the labels SetLabel set ("" for a removal).
	changed map[string]string
}

// Label returns label k ("" when absent).
func (r *Request) Label(k string) string { return r.Labels[k] }

// SetLabel sets label k to v on the request (an empty v removes it).
// Labels are set whatever the verdict, travel with the request and
// survive a re-queue; upstream gives "classification" ("reserved",
// "overflow") and "tier" a meaning.
func (r *Request) SetLabel(k, v string) {
	if r.changed == nil {
		r.changed = map[string]string{}
	}
	r.changed[k] = v
	if v == "" {
		delete(r.Labels, k)
		return
	}
	if r.Labels == nil {
		r.Labels = map[string]string{}
	}
	r.Labels[k] = v
}

// Verdict is the outcome of Admit.
type Verdict int

const (
	// Admit lets the request through now.
	Admit Verdict = iota
	// Defer puts the request back in its queue for Decision.Delay without
	// counting an attempt.
	Defer
	// Reject ends the request with a GATE_DROPPED result carrying
	// Decision.Reason.
	Reject
	// Wait keeps the request in flight (its credit held) and asks again
	// when capacity frees, or after at most Decision.Delay (default 1s),
	// until its deadline.
	Wait
)

// String returns the verdict's lower-case name.
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
	// Verdict is admit, defer, reject or wait.
	Verdict Verdict
	// Delay is how long to wait before asking again (Defer, Wait).
	Delay time.Duration
	// Reason explains a Defer, Reject or Wait; it ends up in logs and
	// results.
	Reason string
}

// Admitted is the decision that lets a request through.
var Admitted = Decision{Verdict: Admit}

// FallbackError is returned by Budget when the gate could not read its
// source and applies a budget of its own choosing instead: sluice uses
// Budget and still counts (and logs) the failure Err.
type FallbackError struct {
	Budget float64
	Err    error
}

// Error implements error.
func (e *FallbackError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("fallback to budget %v", e.Budget)
	}
	return fmt.Sprintf("fallback to budget %v: %v", e.Budget, e.Err)
}

// Unwrap returns the failure.
func (e *FallbackError) Unwrap() error { return e.Err }
