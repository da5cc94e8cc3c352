// Package dispatch is sluice's HTTP client to the inference gateway: it POSTs
// a request's payload to the queue's target with the request's headers and
// deadline, and classifies what came back (success, retryable, fatal,
// deadline exceeded, cancelled).
//
// The call is bounded by the earliest of the request's deadline, now plus
// Config.RequestTimeout, and the caller's context; the client tracks which
// bound ended a call, so that only the request's own deadline yields
// DeadlineExceeded and only the caller's cancellation yields Cancelled.
//
// Do is on the per-message path: targets and endpoint URLs are parsed once
// and cached, headers are built without per-header allocations, and redirects
// are not followed. DoWith is Do for a caller that decides more per call:
// a transformed body (see package core/transform) with its content type,
// and headers of its own that win over the message's.
//
// How a gateway is spoken to is a Poster's business, chosen per target by
// Config.Protocol and the URL's scheme: http gateways under ProtocolHTTP1
// and every https gateway go through package nethttp (net/http's
// Transport); http gateways under ProtocolH2C through package h2c (sluice's
// own HTTP/2 client, which costs no goroutine per call and gathers
// concurrent calls' frames into few writes); http gateways under
// ProtocolAuto, the default, through package auto, which uses h2c with the
// gateways that accept it and nethttp with the others.
package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/core/dispatch/auto"
	"github.com/sluice-io/sluice/core/dispatch/h2c"
	"github.com/sluice-io/sluice/core/dispatch/internal/cowmap"
	"github.com/sluice-io/sluice/core/dispatch/nethttp"
	"github.com/sluice-io/sluice/core/wire"
)

// Tuning that is not configurable.
const (
	dialTimeout  = 5 * time.Second
	tcpKeepAlive = 30 * time.Second
	// poolBufferSize is the initial size of the buffers that read bodies of
	// unknown length; buffers grown past maxPooledBuffer are not kept.
	poolBufferSize  = 32 << 10
	maxPooledBuffer = 1 << 20
)

// Client POSTs requests to gateways. It is safe for concurrent use; create
// one per process (or per set of queues sharing a gateway) and Close it when
// done.
type Client struct {
	cfg            Config
	plain          Poster // http:// gateways
	tls            Poster // https:// gateways
	deadlineHeader string // canonical; "" when disabled
	timeoutHeader  string // canonical; "" when disabled
	fairHeader     string // canonical; "" when stamping is disabled
	fairAttr       string // the metadata key of the fairness id
	targets        cowmap.Map[Target, *preparedTarget]
	names          cowmap.Map[string, string] // header name → canonical name
	bufs           sync.Pool                  // *[]byte for bodies of unknown length
	refused        atomic.Uint64
}

// New returns a client for cfg (defaults applied to a copy). It loads the TLS
// files; errors name the file.
func New(cfg Config) (*Client, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.TLS.Build()
	if err != nil {
		return nil, fmt.Errorf("dispatch: %w", err)
	}
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive}
	// http gateways: HTTP/1.1 through net/http, HTTP/2 with prior
	// knowledge through h2c, or whichever the gateway speaks (auto);
	// https gateways: HTTP/2 offered through ALPN (and HTTP/1.1 too, unless
	// h2c is configured).
	var protocols http.Protocols
	protocols.SetHTTP1(cfg.Protocol != ProtocolH2C)
	protocols.SetHTTP2(true)
	viaNetHTTP := nethttp.New(nethttp.Config{
		Dial:                dialer.DialContext,
		TLS:                 tlsCfg,
		Protocols:           &protocols,
		MaxIdleConnsPerHost: cfg.MaxConns,
		MaxConnsPerHost:     cfg.MaxConnsPerHost,
	})
	c := &Client{
		cfg:            cfg,
		plain:          viaNetHTTP,
		tls:            viaNetHTTP,
		deadlineHeader: headerName(cfg.DeadlineHeader),
		timeoutHeader:  headerName(cfg.TimeoutHeader),
		fairHeader:     cfg.Fairness.headerName(),
		fairAttr:       cfg.Fairness.Attribute,
		targets:        cowmap.Map[Target, *preparedTarget]{Max: maxCachedTargets},
		names:          cowmap.Map[string, string]{Max: maxCachedNames},
	}
	switch cfg.Protocol {
	case ProtocolH2C:
		c.plain = h2c.New(h2c.Config{Dial: dialer.DialContext, MaxConnsPerHost: cfg.MaxConnsPerHost,
			MaxBodyBytes: cfg.MaxResponseBytes})
	case ProtocolAuto:
		c.plain = auto.New(auto.Config{Dial: dialer.DialContext, MaxIdleConnsPerHost: cfg.MaxConns,
			MaxConnsPerHost: cfg.MaxConnsPerHost, MaxBodyBytes: cfg.MaxResponseBytes})
	}
	c.bufs.New = func() any {
		b := make([]byte, 0, poolBufferSize)
		return &b
	}
	return c, nil
}

// Close closes the idle connections. Calls in flight are not interrupted,
// and the client stays usable (new connections are dialled as needed).
func (c *Client) Close() {
	c.tls.CloseIdleConnections()
	if c.plain != c.tls {
		c.plain.CloseIdleConnections()
	}
}

// RefusedHeaders returns how many message headers (and Overrides.Headers)
// the client has refused to forward since it was created.
func (c *Client) RefusedHeaders() uint64 { return c.refused.Load() }

// Prepare checks t and caches its parsed form. Call it when a queue is
// configured so that a bad igw_base_url or request_path_url is reported at
// startup; Do prepares targets it has not seen on its own.
func (c *Client) Prepare(t Target) error {
	_, err := c.target(t)
	return err
}

func (c *Client) target(t Target) (*preparedTarget, error) {
	if pt, ok := c.targets.Load(t); ok {
		return pt, nil
	}
	pt, err := prepareTarget(t)
	if err != nil {
		return nil, fmt.Errorf("dispatch: %w", err)
	}
	pt.poster = c.plain
	if pt.base.Scheme == "https" {
		pt.poster = c.tls
	}
	return c.targets.Store(t, pt), nil
}

// Do POSTs req.Payload to t (or to req.Endpoint under t.BaseURL) and
// classifies the result; see Class for the classes. It is DoWith without
// overrides.
func (c *Client) Do(ctx context.Context, t Target, req *wire.Request) Outcome {
	return c.DoWith(ctx, t, req, Overrides{})
}

// Overrides are what a caller decides per call on top of the message: the
// body a request transform made, with its content type, and headers of its
// own (such as upstream's tier-priority header). The zero value sends the
// message as it is.
type Overrides struct {
	// Body, when non-nil, is sent instead of req.Payload. Like the payload,
	// it is read-only to DoWith.
	Body []byte
	// ContentType, when non-empty, is sent as Content-Type instead of
	// application/json: the content type of Body (for instance
	// "multipart/form-data; boundary=..."). It must be a valid header
	// value, or the call is Fatal without being sent.
	ContentType string
	// ReadBody, when non-nil, reads a 2xx response's body instead of the
	// client (the reader stops with ErrResponseTooLarge past
	// MaxResponseBytes) and returns the Outcome's Body: core/resume's
	// assembly of a stream, for one. Its error ends the call as a failure
	// does (the call's own cause first: a cancelled call is Cancelled).
	ReadBody func(io.Reader) ([]byte, error)
	// Headers are set after the message's headers and the fairness stamp,
	// and win over both: each replaces the header of the same name in any
	// letter case. A name the client refuses (see Client.CheckHeaderName)
	// or an invalid value is refused like a message's header, and counted
	// with them.
	Headers []Header
}

// Header is one header name and value.
type Header struct {
	Name, Value string
}

// DoWith POSTs a request to t (or to req.Endpoint under t.BaseURL) and
// classifies the result; see Class for the classes. It sends req.Payload as
// application/json unless o says otherwise.
//
// Headers are assembled in upstream's order, each step overriding the
// earlier ones:
//  1. Content-Type: application/json, or o.ContentType;
//  2. x-gateway-inference-objective when t.InferenceObjective is set;
//  3. the message's headers except the refused ones (see FilterHeaders);
//     they win over step 2;
//  4. the fairness stamp (see FairnessConfig): the configured metadata
//     attribute replaces the message's fairness header, when it is set and
//     valid;
//  5. o.Headers;
//  6. the deadline header (req.Deadline in Unix milliseconds) and the
//     timeout header (milliseconds left for the call, at least 1) unless
//     disabled; no other step can set them.
//
// Unlike upstream, a message cannot set Content-Type (it is refused and
// counted, see FilterHeaders): the content type belongs to the body sluice
// sends (the producer's JSON, or a transform's body given in o), and a
// message's value could only mislabel it (a multipart body with another
// boundary, for instance).
//
// DoWith always reads the response body to its end and closes it, so that
// the connection is reused.
func (c *Client) DoWith(ctx context.Context, t Target, req *wire.Request, o Overrides) Outcome {
	if req == nil {
		return Outcome{Class: Fatal, Err: errors.New("dispatch: nil request")}
	}
	pt, err := c.target(t)
	if err != nil {
		return Outcome{Class: Fatal, Err: err}
	}
	ep, err := pt.endpoint(req.Endpoint)
	if err != nil {
		return Outcome{Class: Fatal, Err: fmt.Errorf("dispatch: %w", err)}
	}
	if o.ContentType != "" && !validValue(o.ContentType) {
		return Outcome{Class: Fatal, Err: fmt.Errorf("dispatch: content type %q is not a valid header value", o.ContentType)}
	}
	body := req.Payload
	if o.Body != nil {
		body = o.Body
	}

	now := time.Now()
	dl := req.Deadline
	if ctx.Err() != nil || (!dl.IsZero() && !now.Before(dl)) {
		return c.failure(ctx, ctx, dl, ep, nil)
	}
	// The call's own bound: the request's deadline or RequestTimeout,
	// whichever comes first, each with its own cause so failure can tell
	// which one fired. The caller's deadline, if earlier, wins inside
	// WithDeadlineCause.
	callDL, cause := now.Add(c.cfg.RequestTimeout), ErrRequestTimeout
	if !dl.IsZero() && dl.Before(callDL) {
		callDL, cause = dl, ErrRequestDeadline
	}
	effective := callDL
	if pd, ok := ctx.Deadline(); ok && pd.Before(effective) {
		effective = pd
	}
	callCtx, cancel := context.WithDeadlineCause(ctx, callDL, cause)
	defer cancel()

	h, refused := c.headers(pt, req, &o, dl, effective, now)
	resp, err := pt.poster.Post(callCtx, ep.u, h, body)
	if err != nil {
		out := c.failure(ctx, callCtx, dl, ep, err)
		out.Refused = refused
		return out
	}
	out := c.response(ctx, callCtx, dl, ep, resp, o.ReadBody)
	out.Refused = refused
	return out
}

// headers builds the request headers, names in canonical form (a Poster
// writes them as its protocol wants), in the order DoWith documents; it
// returns how many message and override headers were refused.
func (c *Client) headers(pt *preparedTarget, req *wire.Request, o *Overrides, dl, effective, now time.Time) (http.Header, int) {
	n := len(req.Headers) + len(o.Headers) + 5
	h := make(http.Header, n)
	// One backing array for all the single-value slices.
	vals := make([]string, 0, n)
	set := func(k, v string) {
		if old, ok := h[k]; ok {
			h[k] = append(old, v)
			return
		}
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	refused := 0
	for k, v := range req.Headers {
		ck, ok := c.allowHeader(k, v)
		if !ok {
			refused++
			continue
		}
		set(ck, v)
	}
	// Content-Type is refused above: set here, it is the only value.
	if o.ContentType != "" {
		set(headerContentType, o.ContentType)
	} else {
		set(headerContentType, contentTypeJSON)
	}
	if pt.objective != "" {
		if _, ok := h[headerObjective]; !ok {
			set(headerObjective, pt.objective)
		}
	}
	// The stamp wins over the message: its header, in every letter case
	// the message wrote it, is one canonical key here.
	if c.fairHeader != "" {
		if id := req.Metadata[c.fairAttr]; id != "" && len(id) <= MaxFairnessIDBytes && validValue(id) {
			delete(h, c.fairHeader)
			set(c.fairHeader, id)
		}
	}
	for _, x := range o.Headers {
		ck, ok := c.allowHeader(x.Name, x.Value)
		if !ok {
			refused++
			continue
		}
		delete(h, ck)
		set(ck, x.Value)
	}
	if refused > 0 {
		c.refused.Add(uint64(refused))
	}
	// Both numbers are formatted into one buffer and converted to one string.
	var arr [48]byte
	buf := arr[:0]
	useDL := c.deadlineHeader != "" && !dl.IsZero()
	if useDL {
		buf = strconv.AppendInt(buf, dl.UnixMilli(), 10)
	}
	split := len(buf)
	if c.timeoutHeader != "" {
		buf = strconv.AppendInt(buf, max(effective.Sub(now).Milliseconds(), 1), 10)
	}
	if len(buf) > 0 {
		s := string(buf)
		if useDL {
			set(c.deadlineHeader, s[:split])
		}
		if c.timeoutHeader != "" {
			set(c.timeoutHeader, s[split:])
		}
	}
	return h, refused
}

// response reads and classifies a response; it always closes the body.
func (c *Client) response(parent, call context.Context, dl time.Time, ep *endpoint, resp *http.Response, read func(io.Reader) ([]byte, error)) Outcome {
	defer resp.Body.Close()
	out := Outcome{
		Class:         classifyStatus(resp.StatusCode),
		StatusCode:    resp.StatusCode,
		DroppedReason: headerValue(resp.Header, headerDroppedReason),
		Header:        resp.Header,
	}
	if ra := headerValue(resp.Header, headerRetryAfter); ra != "" {
		out.RetryAfter = parseRetryAfter(ra, time.Now())
	}
	var body []byte
	var err error
	if read != nil && out.Class == Success {
		body, err = read(&capReader{r: resp.Body, left: c.cfg.MaxResponseBytes})
	} else {
		body, err = c.readBody(resp.Body, resp.ContentLength)
	}
	if errors.Is(err, ErrResponseTooLarge) {
		out.Class = Fatal
		out.Err = fmt.Errorf("post %s: status %d: %w", ep.s, resp.StatusCode, err)
		return out
	}
	if err != nil {
		f := c.failure(parent, call, dl, ep, fmt.Errorf("status %d, reading body: %w", resp.StatusCode, err))
		f.RetryAfter, f.DroppedReason, f.Header = out.RetryAfter, out.DroppedReason, out.Header
		return f
	}
	out.Body = body
	if out.Class != Success {
		if out.DroppedReason != "" {
			out.Err = fmt.Errorf("post %s: gateway answered %d (dropped: %s)", ep.s, resp.StatusCode, out.DroppedReason)
		} else {
			out.Err = fmt.Errorf("post %s: gateway answered %d", ep.s, resp.StatusCode)
		}
	}
	return out
}

// headerValue is Header.Get for a name already in canonical form.
func headerValue(h http.Header, canonical string) string {
	if v := h[canonical]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// readBody reads r to its end into a slice the caller owns, failing with
// ErrResponseTooLarge past MaxResponseBytes (the rest is not drained: closing
// the body then drops the connection or resets the stream, which is cheaper
// than reading it). With a known length it makes one allocation of that size
// (plus one byte, to see EOF in the same read loop, so that the connection
// goes back to the pool at once); otherwise it reads into a pooled buffer,
// grown to at most the cap plus one byte, and copies the result out.
func (c *Client) readBody(r io.Reader, length int64) ([]byte, error) {
	limit := c.cfg.MaxResponseBytes
	tooLarge := func() error { return fmt.Errorf("%w: more than %d bytes", ErrResponseTooLarge, limit) }
	if length > limit {
		return nil, fmt.Errorf("%w: content length %d exceeds %d bytes", ErrResponseTooLarge, length, limit)
	}
	if length >= 0 {
		buf := make([]byte, length+1)
		n, err := io.ReadFull(r, buf)
		switch {
		case int64(n) == length && (err == io.EOF || err == io.ErrUnexpectedEOF):
			return buf[:n:n], nil
		case err == nil:
			return nil, fmt.Errorf("body longer than its content length %d", length)
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return nil, io.ErrUnexpectedEOF
		case isMaxBytes(err):
			return nil, tooLarge()
		}
		return nil, err
	}
	bp := c.bufs.Get().(*[]byte)
	b := (*bp)[:0]
	defer func() {
		if cap(b) <= maxPooledBuffer {
			*bp = b[:0]
			c.bufs.Put(bp)
		}
	}()
	for {
		if len(b) == cap(b) {
			// Grow like append, but never past the cap plus the one byte
			// that tells the body is too large.
			nb := make([]byte, len(b), int(min(int64(max(2*cap(b), 512)), limit+1)))
			copy(nb, b)
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit || isMaxBytes(err) {
			return nil, tooLarge()
		}
		if err == io.EOF {
			return bytes.Clone(b), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// capReader is r failing with ErrResponseTooLarge once more than left
// bytes were read.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 || isMaxBytes(err) {
		return n, fmt.Errorf("%w: more than the response cap", ErrResponseTooLarge)
	}
	return n, err
}

// isMaxBytes reports whether err says a Poster cut the body at its bound.
func isMaxBytes(err error) bool {
	var mbe *http.MaxBytesError
	return err != nil && errors.As(err, &mbe)
}

// failure classifies a call that produced no complete response (err may be
// nil when the call was not started). parent is the caller's context and call
// the call's own (equal to parent when the call was not started).
func (c *Client) failure(parent, call context.Context, dl time.Time, ep *endpoint, err error) Outcome {
	wrap := func(sentinel error) error {
		if err == nil {
			return fmt.Errorf("post %s: %w", ep.s, sentinel)
		}
		return fmt.Errorf("post %s: %w: %w", ep.s, sentinel, err)
	}
	deadlinePassed := !dl.IsZero() && !time.Now().Before(dl)
	if call.Err() != nil {
		switch cause := context.Cause(call); {
		case cause == ErrRequestDeadline:
			return Outcome{Class: DeadlineExceeded, Err: wrap(ErrRequestDeadline)}
		case cause == ErrRequestTimeout:
			return Outcome{Class: Retryable, Err: wrap(ErrRequestTimeout)}
		case errors.Is(parent.Err(), context.Canceled):
			return Outcome{Class: Cancelled, Err: context.Cause(parent)}
		case deadlinePassed || parentDeadlineAtOrAfter(parent, dl):
			// The caller's deadline is (at least) the request's: it ended
			// the call because the request's deadline came.
			return Outcome{Class: DeadlineExceeded, Err: wrap(ErrRequestDeadline)}
		default:
			// The caller's own deadline, earlier than the request's.
			return Outcome{Class: Retryable, Err: wrap(cause)}
		}
	}
	if deadlinePassed {
		return Outcome{Class: DeadlineExceeded, Err: wrap(ErrRequestDeadline)}
	}
	if err == nil {
		// Not reached: failure is called without err only when the caller's
		// context is done or the deadline has passed.
		return Outcome{Class: Retryable, Err: fmt.Errorf("post %s: not sent", ep.s)}
	}
	return Outcome{Class: Retryable, Err: fmt.Errorf("post %s: %w", ep.s, err)}
}

// parentDeadlineAtOrAfter reports whether ctx has a deadline no earlier than dl.
func parentDeadlineAtOrAfter(ctx context.Context, dl time.Time) bool {
	pd, ok := ctx.Deadline()
	return ok && !dl.IsZero() && !pd.Before(dl)
}
