package transform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Chain runs a config's transforms in order, with upstream's semantics:
// Validate runs every transform and the first error wins; Apply stops at
// the first transform that handles the request. Errors are prefixed
// "transform <name>/<type>: ". A Chain is immutable and safe for concurrent
// use; a nil or empty Chain does nothing.
type Chain struct {
	steps []step
}

type step struct {
	name, typ string
	t         Transform
}

// NewChain builds cfg's transforms with r, in order. cfg must be valid
// (Parse validates it); an unregistered type or a factory's error is
// reported with the entry's index and name, every failing entry at once.
// On error, the transforms already built are closed.
func NewChain(cfg Config, r *Registry, env Env) (*Chain, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Chain{steps: make([]step, 0, len(cfg.RequestTransforms))}
	var errs []error
	for i, e := range cfg.RequestTransforms {
		env := env
		env.Name = e.Name
		t, err := r.New(e.Type, e.Parameters, env)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.label(i), err))
			continue
		}
		c.steps = append(c.steps, step{name: e.Name, typ: e.Type, t: t})
	}
	if len(errs) > 0 {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Len returns the number of transforms.
func (c *Chain) Len() int {
	if c == nil {
		return 0
	}
	return len(c.steps)
}

// Validate runs every transform's Validate in order and returns the first
// error, prefixed "transform <name>/<type>: ".
func (c *Chain) Validate(ctx context.Context, payload []byte, metadata map[string]string, deadline time.Time) error {
	if c == nil {
		return nil
	}
	for _, s := range c.steps {
		if err := s.t.Validate(ctx, payload, metadata, deadline); err != nil {
			return s.wrap(err)
		}
	}
	return nil
}

// Apply runs the transforms in order until one handles the request, and
// returns its body and content type with handled true. When none does, it
// returns payload itself, no content type and handled false: send the
// payload as it is (application/json). Both results fit
// dispatch.Overrides{Body: body, ContentType: contentType} as they are. A
// transform's error stops the chain and is returned prefixed
// "transform <name>/<type>: ", as is a handled body without a valid
// content type.
func (c *Chain) Apply(ctx context.Context, payload []byte, metadata map[string]string) (body []byte, contentType string, handled bool, err error) {
	if c == nil {
		return payload, "", false, nil
	}
	for _, s := range c.steps {
		body, ct, ok, err := s.t.Apply(ctx, payload, metadata)
		if err != nil {
			return nil, "", false, s.wrap(err)
		}
		if !ok {
			continue
		}
		if !validContentType(ct) {
			return nil, "", false, s.wrap(fmt.Errorf("handled the body with content type %q, not a valid header value", ct))
		}
		return body, ct, true, nil
	}
	return payload, "", false, nil
}

// Close closes the transforms that implement io.Closer, in reverse order,
// and returns their errors joined.
func (c *Chain) Close() error {
	if c == nil {
		return nil
	}
	var errs []error
	for i := len(c.steps) - 1; i >= 0; i-- {
		if cl, ok := c.steps[i].t.(io.Closer); ok {
			if err := cl.Close(); err != nil {
				errs = append(errs, c.steps[i].wrap(err))
			}
		}
	}
	return errors.Join(errs...)
}

func (s step) wrap(err error) error {
	return fmt.Errorf("transform %s/%s: %w", s.name, s.typ, err)
}

// validContentType reports whether ct can be sent as Content-Type: not
// empty, and no control bytes other than tab (no CR/LF injection), no DEL.
func validContentType(ct string) bool {
	if ct == "" {
		return false
	}
	for i := 0; i < len(ct); i++ {
		if b := ct[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
