// Package objhttp holds what the object-store backends (filestore/s3,
// filestore/gcs) share on top of net/http: one request sent with retries
// on transient failures, and a reader that stops a copy once its context
// ends.
package objhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// MaxTries bounds the attempts of one request (the first included).
const MaxTries = 4

// StatusError is a response the store answered with an unexpected
// status; Code is the HTTP status and Message what the store said.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("HTTP %d", e.Code)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Code, e.Message)
}

// IsStatus reports whether err is a StatusError with status code.
func IsStatus(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

// Transient reports whether a request that got status code may succeed
// when sent again: throttling and server errors.
func Transient(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500
}

// Do sends the request newReq builds (a fresh one per attempt, so a body
// is sent whole each time) and returns the response when its status is
// one of ok. A transport error or a transient status is retried with
// exponential backoff, at most MaxTries attempts in all, while ctx lasts;
// any other status is returned at once as a *StatusError whose message
// is decode's reading of the body. The caller closes the body of the
// response returned.
func Do(ctx context.Context, hc *http.Client, newReq func() (*http.Request, error), decode func(code int, body []byte) string, ok ...int) (*http.Response, error) {
	exp := backoff.NewExponentialBackOff()
	exp.InitialInterval = 100 * time.Millisecond
	exp.MaxInterval = 2 * time.Second
	return backoff.Retry(ctx, func() (*http.Response, error) {
		req, err := newReq()
		if err != nil {
			return nil, backoff.Permanent(err)
		}
		resp, err := hc.Do(req.WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil, backoff.Permanent(err)
			}
			return nil, err
		}
		for _, c := range ok {
			if resp.StatusCode == c {
				return resp, nil
			}
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		serr := &StatusError{Code: resp.StatusCode, Message: decode(resp.StatusCode, body)}
		if Transient(resp.StatusCode) {
			return nil, serr
		}
		return nil, backoff.Permanent(serr)
	}, backoff.WithBackOff(exp), backoff.WithMaxTries(MaxTries))
}

// CtxReader fails a copy once its context ends.
type CtxReader struct {
	Ctx context.Context
	R   io.Reader
}

func (c CtxReader) Read(p []byte) (int, error) {
	if err := c.Ctx.Err(); err != nil {
		return 0, err
	}
	return c.R.Read(p)
}
