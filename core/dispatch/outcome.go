package dispatch

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Class is what a call's outcome means for the request.
type Class int

// The outcome classes.
const (
	// Success: the gateway answered 2xx.
	Success Class = iota
	// Retryable: the gateway answered 429 or 5xx, or no complete response came
	// back for a reason other than the request's deadline or the caller's
	// cancellation (connection refused or reset, EOF, dial or TLS failure,
	// RequestTimeout elapsed, the caller's context deadline before the
	// request's). The request may be tried again before its deadline.
	Retryable
	// Fatal: the gateway answered with another status (4xx other than 429, or
	// a 1xx/3xx it did not resolve: redirects are not followed), the response
	// was bigger than MaxResponseBytes, or the target or endpoint is invalid.
	Fatal
	// DeadlineExceeded: the request's deadline passed before a complete
	// response came back (or before the call started).
	DeadlineExceeded
	// Cancelled: the caller's context was cancelled (shutdown, cancellation);
	// Outcome.Err is context.Cause of that context.
	Cancelled
)

// String returns the class name.
func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Retryable:
		return "retryable"
	case Fatal:
		return "fatal"
	case DeadlineExceeded:
		return "deadline_exceeded"
	case Cancelled:
		return "cancelled"
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// Outcome is the result of one call to the gateway.
type Outcome struct {
	// Class says what the outcome means for the request.
	Class Class
	// StatusCode is the gateway's HTTP status; 0 when no response came back
	// or its body could not be read completely.
	StatusCode int
	// Body is the raw response body when a complete response came back. The
	// caller owns it.
	Body []byte
	// RetryAfter is the gateway's Retry-After (delay seconds or HTTP-date),
	// 0 when absent, unparsable or in the past.
	RetryAfter time.Duration
	// DroppedReason is the response header x-llm-d-request-dropped-reason.
	DroppedReason string
	// Header holds the response's headers when a response came back (nil
	// otherwise), for the gates that learn from them (gate.Feedback).
	Header http.Header
	// Refused counts the message headers that were not forwarded (see
	// Client.FilterHeaders), and the Overrides.Headers refused likewise, so
	// the caller can log them with the request id.
	Refused int
	// Err says why the call did not succeed; nil on Success.
	Err error
}

// Sentinel errors wrapped in Outcome.Err.
var (
	// ErrRequestDeadline: the request's deadline passed (class DeadlineExceeded).
	ErrRequestDeadline = errors.New("request deadline exceeded")
	// ErrRequestTimeout: Config.RequestTimeout elapsed first (class Retryable).
	ErrRequestTimeout = errors.New("request timeout elapsed")
	// ErrResponseTooLarge: the body exceeded Config.MaxResponseBytes (class Fatal).
	ErrResponseTooLarge = errors.New("response body too large")
)

// classifyStatus maps an HTTP status to a class.
func classifyStatus(code int) Class {
	switch {
	case code >= 200 && code <= 299:
		return Success
	case code == http.StatusTooManyRequests || (code >= 500 && code <= 599):
		return Retryable
	}
	return Fatal
}

// maxRetryAfterSeconds keeps the conversion to a Duration from overflowing.
const maxRetryAfterSeconds = math.MaxInt64 / int64(time.Second)

// parseRetryAfter parses a Retry-After value: delay seconds or an HTTP-date
// (relative to now). It returns 0 when v is empty, invalid or in the past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return time.Duration(maxRetryAfterSeconds) * time.Second
			}
			return 0
		}
		return time.Duration(min(n, maxRetryAfterSeconds)) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if d := t.Sub(now); d > 0 {
		return d
	}
	return 0
}
