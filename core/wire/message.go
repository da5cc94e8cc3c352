// Package wire is sluice's wire model: the request a producer enqueues, the
// result sluice writes back, and the error codes a result can carry.
//
// Two request forms are accepted (see COMPAT.md):
//
//   - the flat form of the queue design: {"id","created","deadline","payload",
//     "metadata","headers","endpoint"}, where created and deadline are Unix
//     seconds given as integers, fractional numbers or strings;
//   - upstream's tagged envelope {"request_kind","internal":{...},"data":{flat}}.
//
// The payload is kept as the exact bytes the producer wrote: sluice forwards it
// to the gateway byte for byte and never re-marshals it.
package wire

import (
	"encoding/json"
	"errors"
	"time"
)

// ErrorCode classifies a failed result. The empty code means success.
type ErrorCode string

// The error codes a result can carry; the strings are part of the wire format.
const (
	CodeNone             ErrorCode = ""
	CodeDeadlineExceeded ErrorCode = "DEADLINE_EXCEEDED"
	CodeCancelled        ErrorCode = "CANCELLED"
	CodeGateDropped      ErrorCode = "GATE_DROPPED"
	CodeGateError        ErrorCode = "GATE_ERROR"
	CodeInferenceError   ErrorCode = "INFERENCE_ERROR"
	CodeInvalidRequest   ErrorCode = "INVALID_REQUEST"
	// CodePayloadUnavailable answers a request whose payload was kept in its
	// own key (upstream's internal.payload_ref) and is gone.
	CodePayloadUnavailable ErrorCode = "PAYLOAD_UNAVAILABLE"
)

// Request is one inference request taken from a queue.
type Request struct {
	// ID identifies the request; a result carries the same id.
	ID string
	// Created is when the producer created the request (zero when absent).
	Created time.Time
	// Deadline is when the result stops being useful; always set on a decoded request.
	Deadline time.Time
	// Payload is the JSON body for the gateway, exactly as the producer wrote it.
	Payload json.RawMessage
	// Metadata is opaque correlation data echoed in the result (job_id, request_index, ...).
	Metadata map[string]string
	// Headers are forwarded to the gateway (hop-by-hop and framing headers are refused there).
	Headers map[string]string
	// Endpoint, when set, overrides the queue's request path.
	Endpoint string
	// Model is the request's optional top-level model (upstream's
	// data.model); it labels traces only and is never sent downstream.
	// Empty when absent or not a string.
	Model string

	// Envelope fields; empty for the flat form.

	// Kind is the envelope's request_kind ("plain", "redis", "pubsub"); empty for the flat form.
	Kind string
	// RetryCount is the number of earlier attempts carried by the envelope.
	RetryCount int
	// QueueID is the envelope's internal.queue_id (upstream labels metrics with it).
	QueueID string
	// Token is the envelope's request_token, paired with upstream cancellation keys.
	Token string
	// RequestQueueName and ResultQueueName are the queue names the envelope named, if any.
	RequestQueueName string
	ResultQueueName  string
	// Labels are the envelope's internal.labels: set by the queue's config
	// when the request is taken and by gates (the classification), kept
	// when the request is re-queued. nil when there are none.
	Labels map[string]string
	// KeptResult is the result of an earlier delivery that could not be
	// written (the envelope's internal.kept_result, set by WithKeptResult):
	// the request was answered already and only its result is to be
	// written, without calling the gateway again. nil when there is none.
	KeptResult json.RawMessage
}

// Label names and values upstream gives a meaning to.
const (
	// LabelClassification holds ClassReserved or ClassOverflow (set by quota gates).
	LabelClassification = "classification"
	ClassReserved       = "reserved"
	ClassOverflow       = "overflow"
	// DefaultTierLabel is the label holding the tier, unless a gate or
	// policy names another (tier_label).
	DefaultTierLabel = "tier"
	TierInteractive  = "interactive"
	TierAsync        = "async"
	TierBatch        = "batch"
)

// Label returns label k ("" when absent).
func (r *Request) Label(k string) string { return r.Labels[k] }

// SetLabel sets label k to v; an empty v removes it.
func (r *Request) SetLabel(k, v string) {
	if v == "" {
		delete(r.Labels, k)
		return
	}
	if r.Labels == nil {
		r.Labels = map[string]string{}
	}
	r.Labels[k] = v
}

// Classification returns the classification label ("" when unclassified).
func (r *Request) Classification() string { return r.Labels[LabelClassification] }

// SetClassification sets the classification label ("" removes it).
func (r *Request) SetClassification(c string) { r.SetLabel(LabelClassification, c) }

// JobID returns metadata["job_id"], the key job-level cancellation works on.
func (r *Request) JobID() string { return r.Metadata["job_id"] }

// Expired reports whether the deadline has passed at now.
func (r *Request) Expired(now time.Time) bool { return !now.Before(r.Deadline) }

// Result is what sluice writes to a result queue, exactly one per request.
type Result struct {
	// ID is the id of the request this result answers.
	ID string `json:"id"`
	// StatusCode is the gateway's HTTP status; 0 (omitted) when no response came back.
	StatusCode int `json:"status_code,omitempty"`
	// Payload is the gateway's raw response body, or {"error":"..."} when there was none.
	Payload string `json:"payload"`
	// Metadata echoes the request's metadata.
	Metadata map[string]string `json:"metadata,omitempty"`
	// ErrorCode classifies a failure; CodeNone (omitted) on success and, as
	// upstream writes it, on a final answer of the gateway with a status of
	// 400 or above (a non-retryable 4xx, or the last response when the
	// retries ran out): StatusCode and Payload then carry that answer.
	ErrorCode ErrorCode `json:"error_code,omitempty"`
	// ErrorMessage explains a failure for people; omitted when empty.
	ErrorMessage string `json:"error_message,omitempty"`
}

// OK reports whether the result is a success: no error code, and no
// gateway status of 400 or above.
func (r *Result) OK() bool { return r.ErrorCode == CodeNone && r.StatusCode < 400 }

// DecodeError is returned by Decode for a message that is not a valid request.
// ID is set when an id could still be read, so the caller can answer with an
// INVALID_REQUEST result; when ID is empty the message belongs in a dead-letter
// destination.
type DecodeError struct {
	// ID is the request's id, or "" when none could be read.
	ID string
	// Metadata is the request's metadata when it could be read, to be echoed.
	Metadata map[string]string
	// Reason says what is wrong, naming the field: "deadline: missing".
	Reason string
}

// Error implements error: "invalid request <id>: <reason>".
func (e *DecodeError) Error() string {
	if e.ID == "" {
		return "invalid request: " + e.Reason
	}
	return "invalid request " + e.ID + ": " + e.Reason
}

// AsDecodeError returns the *DecodeError inside err, if any.
func AsDecodeError(err error) (*DecodeError, bool) {
	var de *DecodeError
	ok := errors.As(err, &de)
	return de, ok
}
