package dispatch

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sluice-io/sluice/core/dispatch/auto"
	"github.com/sluice-io/sluice/core/dispatch/h2c"
	"github.com/sluice-io/sluice/core/dispatch/nethttp"
)

// Poster is the protocol client behind Client.Do, the one interface through
// which every call reaches a gateway: package nethttp (HTTP/1.1, and https
// through ALPN), package h2c (HTTP/2 with prior knowledge) and package auto
// (either, as each gateway speaks) implement it.
// Client.Do does the rest: headers, the call's bounds, the body cap and the
// classification of what comes back.
//
// Post sends body to u with the headers h and returns the response once its
// status and headers have arrived. Its contract:
//   - ctx bounds the whole exchange: when it ends, Post returns (with an
//     error wrapping ctx's) and so does a Read of the response body.
//   - u, h and body are shared and read-only: Post and the body's reader
//     modify none of them. u may be kept (an implementation may cache what
//     it derives from it), h and body not past the body's Close. h's names
//     are valid header names (canonical form), none of them hop-by-hop or
//     Content-Length: the request's length is len(body).
//   - An error means no response: the request may or may not have been
//     processed. A Poster sends a request again only when the gateway
//     certainly did not process it.
//   - On success the response has StatusCode, Header (canonical names),
//     ContentLength (-1 when unknown) and Body set. The caller must close
//     Body; closing it before the end abandons the rest of the response. A
//     Poster that bounds the body itself fails Read with an error wrapping
//     *http.MaxBytesError once the body is longer than its bound.
//
// CloseIdleConnections closes the connections that carry no call; calls in
// flight go on, and the Poster stays usable. Both methods are safe for
// concurrent use.
type Poster interface {
	Post(ctx context.Context, u *url.URL, h http.Header, body []byte) (*http.Response, error)
	CloseIdleConnections()
}

// The protocol clients implement Poster.
var (
	_ Poster = (*nethttp.Transport)(nil)
	_ Poster = (*h2c.Transport)(nil)
	_ Poster = (*auto.Transport)(nil)
)
