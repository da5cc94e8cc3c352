package dispatch

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/sluice-io/sluice/core/dispatch/internal/cowmap"
)

// Target is where one queue's requests go: the queue's igw_base_url,
// request_path_url and inference_objective.
//
// Targets are comparable values. The Client parses a Target once and caches
// the result (together with the URLs of the endpoints its messages name), so
// passing the same Target on every call costs a map lookup, not a URL parse.
// Call Client.Prepare at startup to check a Target before the first message.
type Target struct {
	// BaseURL is the gateway's base URL: http or https, a host, and optionally
	// a path prefix (http://gw/prefix). It carries no query or fragment.
	BaseURL string
	// Path is the request path joined to BaseURL when a message names no
	// endpoint. Default "/v1/completions". It may carry a query.
	Path string
	// InferenceObjective, when set, is sent as x-gateway-inference-objective
	// (unless the message's own headers set it).
	InferenceObjective string
}

// ErrInvalidTarget is wrapped by errors about a Target that cannot be used.
var ErrInvalidTarget = errors.New("invalid target")

// ErrInvalidEndpoint is wrapped in the Fatal outcome of a request whose
// endpoint is not a path (it names a scheme or a host, or does not parse).
// Callers map it to INVALID_REQUEST.
var ErrInvalidEndpoint = errors.New("invalid endpoint")

// Cache bounds: targets come from configuration and endpoints from a handful
// of API paths, so these are never reached in practice; past them, URLs are
// computed per call instead of growing without bound.
const (
	maxCachedTargets   = 1024
	maxCachedEndpoints = 64
	maxCachedNames     = 256
)

// endpoint is one fully joined request URL, shared read-only by all calls.
type endpoint struct {
	u *url.URL
	s string // u.Redacted(), for error messages
}

// preparedTarget is a parsed Target.
type preparedTarget struct {
	base      *url.URL
	def       *endpoint
	objective string
	endpoints cowmap.Map[string, *endpoint]
	poster    Poster // the protocol client for its scheme; set by Client.target
}

func prepareTarget(t Target) (*preparedTarget, error) {
	base, err := url.Parse(t.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("%w: base url: %w", ErrInvalidTarget, err)
	}
	switch {
	case base.Scheme != "http" && base.Scheme != "https":
		return nil, fmt.Errorf("%w: base url %q: scheme must be http or https", ErrInvalidTarget, t.BaseURL)
	case base.Host == "":
		return nil, fmt.Errorf("%w: base url %q has no host", ErrInvalidTarget, t.BaseURL)
	case base.RawQuery != "" || base.ForceQuery || base.Fragment != "":
		return nil, fmt.Errorf("%w: base url %q must not have a query or fragment", ErrInvalidTarget, t.BaseURL)
	}
	p := t.Path
	if p == "" {
		p = DefaultPath
	}
	def, err := joinURL(base, p)
	if err != nil {
		return nil, fmt.Errorf("%w: request path: %w", ErrInvalidTarget, err)
	}
	return &preparedTarget{
		base:      base,
		def:       def,
		objective: t.InferenceObjective,
		endpoints: cowmap.Map[string, *endpoint]{Max: maxCachedEndpoints},
	}, nil
}

// endpoint returns the URL for a message's endpoint ("" means the target's path).
func (pt *preparedTarget) endpoint(ep string) (*endpoint, error) {
	if ep == "" {
		return pt.def, nil
	}
	if e, ok := pt.endpoints.Load(ep); ok {
		return e, nil
	}
	e, err := joinURL(pt.base, ep)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalidEndpoint, ep, err)
	}
	return pt.endpoints.Store(ep, e), nil
}

// joinURL joins base (already checked) with a path reference p: exactly one
// slash between the base path and p, base path prefix kept, p's query kept,
// p's trailing slash kept. p must not name a scheme or a host.
func joinURL(base *url.URL, p string) (*endpoint, error) {
	ref, err := url.Parse(p)
	if err != nil {
		return nil, err
	}
	if ref.Scheme != "" || ref.Host != "" || ref.User != nil || ref.Opaque != "" {
		return nil, fmt.Errorf("%q is not a path", p)
	}
	if ref.Fragment != "" {
		return nil, fmt.Errorf("%q has a fragment", p)
	}
	var b strings.Builder
	b.WriteString(base.Scheme)
	b.WriteString("://")
	if base.User != nil {
		b.WriteString(base.User.String())
		b.WriteByte('@')
	}
	b.WriteString(base.Host)
	b.WriteString(strings.TrimRight(base.EscapedPath(), "/"))
	b.WriteByte('/')
	b.WriteString(strings.TrimLeft(ref.EscapedPath(), "/"))
	if ref.RawQuery != "" {
		b.WriteByte('?')
		b.WriteString(ref.RawQuery)
	}
	u, err := url.Parse(b.String())
	if err != nil {
		return nil, err
	}
	return &endpoint{u: u, s: u.Redacted()}, nil
}
