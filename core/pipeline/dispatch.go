package pipeline

// The dispatch: the handler at the end of the middleware chain, which makes
// a request's one HTTP call to the gateway and turns its outcome into what
// the request gets.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/resume"
	"github.com/sluice-io/sluice/core/transform"
	"github.com/sluice-io/sluice/core/wire"
)

// Dispatcher sends a request to the gateway; *dispatch.Client implements
// it. o carries a transformed body and the headers that win over the
// request's (the priority lane).
type Dispatcher interface {
	DoWith(ctx context.Context, t dispatch.Target, req *wire.Request, o dispatch.Overrides) dispatch.Outcome
}

// dispatchHandler is the handler at the end of the chain: one HTTP call, whose
// outcome the dispatch client classified (the one place that tells a
// deadline from a cancellation or a timeout); here each class becomes what
// the request gets. The transforms (nil: none) rewrite the body of each
// attempt; a failure is INVALID_REQUEST, as upstream.
//
// In steps: overridesOf prepares the attempt (lane headers, transformed or
// resumed body), callGateway makes it, countAnswer counts what came back, and
// resultOf turns the outcome into the request's result, an error to retry,
// or a hand-back.
func dispatchHandler(client Dispatcher, transforms *transform.Chain) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		d := deliveryOf(m)
		ov, rc, out := overridesOf(d, transforms)
		if out != nil {
			return out, nil
		}
		mq := d.mq()
		o := callGateway(client, d, mq, ov, rc)
		countAnswer(mq, o)
		return resultOf(d, o)
	}
}

// overridesOf prepares d's attempt: the headers of its priority lane, the
// body the transforms make of it, or under Queue.Resume the call that
// continues from the earlier attempts (rc, nil otherwise). out is not nil
// when the request is answered without a call: the transforms failed
// (INVALID_REQUEST), or the earlier attempts already made every token
// allowed.
func overridesOf(d *delivery, transforms *transform.Chain) (ov dispatch.Overrides, rc *resume.Call, out []*message.Message) {
	if p := d.Queue.priority; p != nil {
		ov.Headers = p.headers[p.lane(d.Req)]
	}
	if transforms != nil && transforms.Len() > 0 {
		body, ct, handled, err := transforms.Apply(d.Ctx, d.Req.Payload, d.Req.Metadata)
		if err != nil {
			return ov, nil, fail(d, wire.CodeInvalidRequest, "Failed to transform request body: "+err.Error())
		}
		if handled {
			ov.Body, ov.ContentType = body, ct
		}
	}
	if d.Queue.Resume && ov.Body == nil {
		var answered []byte
		if rc, answered = resumeCall(d); answered != nil {
			// the earlier attempts made every token allowed
			return ov, nil, finish(d, answer(d.Req, dispatch.Outcome{Class: dispatch.Success, StatusCode: http.StatusOK, Body: answered}))
		}
		if rc != nil {
			ov.Body, ov.ReadBody = rc.Body(), rc.Read
		}
	}
	return ov, rc, nil
}

// callGateway makes d's HTTP call with ov (to the queue's gateway, or to the
// pod the gate placed the request on), counted in flight in mq, inside the
// request's HTTP span and tracked by the queue's evictor (when it has
// one), and records the outcome in d.Dispatch. An evicted call under
// Queue.Resume keeps what it made (keepResumed).
func callGateway(client Dispatcher, d *delivery, mq *metrics.Queue, ov dispatch.Overrides, rc *resume.Call) dispatch.Outcome {
	mq.Inflight.Inc()
	mq.Dispatched.Inc()
	d.Dispatched = time.Now()
	ctx, req, end := httpSpan(d)
	untrack := func() {}
	if ev := d.Queue.evictor; ev != nil {
		ctx, untrack = ev.track(d, ctx)
	}
	t := d.Queue.Target
	if d.Pod != "" {
		t.BaseURL = d.Pod // placed on a pod by the gate: the queue's path there
	}
	o := client.DoWith(ctx, t, req, ov)
	untrack()
	if rc != nil && o.Class == dispatch.Cancelled && errors.Is(o.Err, errEvicted) {
		keepResumed(d, rc)
	}
	mq.InferenceMs.Observe(metrics.Millis(time.Since(d.Dispatched)))
	mq.Inflight.Dec()
	end(o.StatusCode)
	d.Dispatch = o
	return o
}

// keepResumed keeps what rc, an aborted call, made for the request's next
// attempt: the state in its StateLabel, the new tokens counted as resumed.
func keepResumed(d *delivery, rc *resume.Call) {
	s := rc.State()
	d.Req.SetLabel(resume.StateLabel, s.Encode())
	if made := s.Tokens - rc.Prior().Tokens; made > 0 {
		d.mq().Resumed.Add(float64(made))
	}
}

// countAnswer counts in mq what the gateway's answer says: a 429 (shed), a
// request the gateway dropped, and the tokens of a 2xx that reports usage.
func countAnswer(mq *metrics.Queue, o dispatch.Outcome) {
	if o.StatusCode == http.StatusTooManyRequests {
		mq.Shedded.Inc()
	}
	if o.DroppedReason != "" {
		mq.GatewayDropped.Inc()
	}
	if o.StatusCode >= 200 && o.StatusCode < 300 {
		if in, out, ok := dispatch.ParseUsage(o.Body); ok {
			mq.TokensIn.Add(float64(in))
			mq.TokensOut.Add(float64(out))
		}
	}
}

// resultOf turns the classified outcome o of d's call into what the
// request gets: the gateway's answer as it came, an error result, an error
// the retrier re-queues (a retryable answer, an eviction), or errShutdown,
// which hands the delivery back.
func resultOf(d *delivery, o dispatch.Outcome) ([]*message.Message, error) {
	switch o.Class {
	case dispatch.Success:
		return finish(d, answer(d.Req, o)), nil
	case dispatch.Fatal:
		switch {
		case errors.Is(o.Err, dispatch.ErrInvalidEndpoint):
			return fail(d, wire.CodeInvalidRequest, o.Err.Error()), nil
		case errors.Is(o.Err, dispatch.ErrResponseTooLarge):
			return fail(d, wire.CodeInferenceError, fmt.Sprintf("%v (limit: dispatch.max_response_bytes)", o.Err)), nil
		case o.StatusCode == 0:
			return fail(d, wire.CodeInferenceError, fmt.Sprint(o.Err)), nil
		}
		// A non-retryable answer (4xx other than 429), empty body or not:
		// passed on as it came, without an error code, as upstream does.
		return finish(d, answer(d.Req, o)), nil
	case dispatch.DeadlineExceeded:
		return fail(d, wire.CodeDeadlineExceeded, "deadline exceeded"), nil // upstream's text
	case dispatch.Cancelled:
		// Err is the cause the call was cancelled with.
		switch {
		case errors.Is(o.Err, errCancelled):
			return fail(d, wire.CodeCancelled, "cancelled during dispatch"), nil
		case errors.Is(o.Err, errShutdown):
			return nil, errShutdown
		case errors.Is(o.Err, errEvicted):
			return nil, errEvicted // retrier re-queues it
		}
	}
	return nil, &retryableError{Outcome: o}
}

// answer is the result carrying the gateway's response as it came.
func answer(req *wire.Request, o dispatch.Outcome) *wire.Result {
	return &wire.Result{ID: req.ID, StatusCode: o.StatusCode, Payload: string(o.Body), Metadata: req.Metadata}
}

// resumeCall prepares d's attempt under Queue.Resume: the call that
// streams and continues from the request's StateLabel, or nil when the
// request cannot be resumed (it is sent as it is); answered is the final
// answer when the earlier attempts already made every token allowed. A
// label that does not decode is dropped: the request starts again.
func resumeCall(d *delivery) (rc *resume.Call, answered []byte) {
	prior, err := resume.Decode(d.Req.Label(resume.StateLabel))
	if err != nil {
		// only sluice writes the label: a damaged one costs the tokens it
		// held, not the request
		prior = resume.State{}
	}
	rc, ok := resume.Start(d.Req.Payload, prior)
	if !ok {
		return nil, nil
	}
	if b, done := rc.Finished(); done {
		return nil, b
	}
	return rc, nil
}
