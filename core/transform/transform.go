// Package transform is sluice's request body transforms, upstream's
// --transform-config-file: a chain of plugins that may rewrite a request's
// JSON payload into another body for the gateway (for instance
// multipart/form-data, for an endpoint that does not take JSON), with the
// content type that goes with it.
//
// A deployment names its transforms in a file (see Config and Load); each
// entry names a type, which a Registry maps to a Factory. Registration is
// explicit: a program registers the types it links (cmd/sluice does so in
// cmd/sluice/adapters.go), as it does its transports and gates.
//
// The pipeline calls Chain.Validate once when a request is taken, after its
// deadline check and before admission, and Chain.Apply on every attempt,
// right before the HTTP call; an error from either is fatal to the request
// (an INVALID_REQUEST result). When a transform handled the body, the
// pipeline sends it with its content type (dispatch.Overrides); otherwise
// the payload goes out as the producer wrote it.
//
// Transforms see the producer's payload bytes verbatim. Upstream hands them
// json.Marshal of its decoded payload instead (keys sorted, HTML characters
// escaped, numbers as float64), and sends those bytes when no transform
// handles a request; sluice sends the producer's bytes, as it always does.
package transform

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-io/sluice/core/registry"
)

// Transform rewrites request bodies. Its methods are called concurrently,
// for many requests at once. payload and metadata are the request's, shared
// and read-only: a Transform modifies neither and keeps neither past the
// call (a returned body must not alias payload).
type Transform interface {
	// Validate checks a request once, when it is taken and before it is
	// admitted, so that a request that cannot succeed fails at once
	// instead of taking a credit (for instance a signed URL that expires
	// before the request's deadline). It returns nil for requests the
	// transform does not handle. deadline is the request's (zero when it
	// has none). An error is fatal to the request.
	Validate(ctx context.Context, payload []byte, metadata map[string]string, deadline time.Time) error
	// Apply returns the body to send instead of payload and its content
	// type (a valid header value, for instance "multipart/form-data;
	// boundary=..."), with handled true; or handled false, and no body,
	// for a request the transform does not handle. It is called on every
	// attempt, right before the HTTP call; the caller owns the body. An
	// error is fatal to the request.
	Apply(ctx context.Context, payload []byte, metadata map[string]string) (body []byte, contentType string, handled bool, err error)
}

// Env is what a transform factory gets besides its parameters.
type Env struct {
	// Name is the entry's name in the config file, for logs.
	Name string
	// Logger is where the transform logs; Registry.New gives a discarding
	// logger when it is nil.
	Logger *slog.Logger
}

// Factory builds a transform from the "parameters" of its config entry (nil
// when the entry has none). It must reject unknown parameters and invalid
// values.
type Factory func(params json.RawMessage, env Env) (Transform, error)

// Registry maps transform type names to factories: the "transform type"
// namespace of the generic registry (Register, Lookup, Has, Names: a
// duplicate type is an error, an unknown one an error naming the known
// ones), plus New.
type Registry struct {
	*registry.Registry[Factory]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{registry.New[Factory]("transform type")}
}

// New builds a transform of type typ. Errors of the factory are prefixed
// with the type.
func (r *Registry) New(typ string, params json.RawMessage, env Env) (Transform, error) {
	f, err := r.Lookup(typ)
	if err != nil {
		return nil, err
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	t, err := f(params, env)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", typ, err)
	}
	if t == nil {
		return nil, fmt.Errorf("%s: factory returned no transform", typ)
	}
	return t, nil
}
