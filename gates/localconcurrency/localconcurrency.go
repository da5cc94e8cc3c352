// Package localconcurrency is the gate of type "local-max-concurrency": an
// in-process cap on the requests it has admitted and not yet released, one
// counter per gate instance (replicas do not share it), as upstream's.
//
//	{"gate_type":"local-max-concurrency","gate_params":{"limit":50,"gating_mode":"classifying"}}
//
// Budget = (limit − inFlight) / limit, 0 when full. Admit takes a slot and
// returns its Release (the pipeline calls it when the request ends; extra
// calls do nothing). When every slot is taken:
//
//   - classifying (the default): Defer at once;
//   - blocking: wait for a slot until ctx ends (the pipeline bounds ctx by
//     the request's deadline), then return an error wrapping the context's,
//     as upstream. The request's handler waits with it, so a blocking gate
//     belongs where a worker may wait (a pool gate); wait-on-refuse around a
//     classifying gate waits without holding a handler's Admit call.
//
// The gate never sets a classification. It holds no resources: Close is not
// needed.
package localconcurrency

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Type is the gate's registry name.
const Type = "local-max-concurrency"

// Mode is how Admit answers when every slot is taken.
type Mode string

const (
	// Classifying defers a request when every slot is taken (the default).
	Classifying Mode = "classifying"
	// Blocking waits for a slot until the request's context ends.
	Blocking Mode = "blocking"
)

// Config configures a Gate.
type Config struct {
	// Limit is how many admitted requests may hold a slot at once (required, > 0).
	Limit int
	// Mode is Classifying (default) or Blocking.
	Mode Mode
}

func (c *Config) setDefaults() {
	if c.Mode == "" {
		c.Mode = Classifying
	}
}

// Validate reports an unusable configuration, naming the parameter.
func (c Config) Validate() error {
	var errs []error
	if c.Limit <= 0 {
		errs = append(errs, fmt.Errorf("gate_params.limit: %d must be > 0", c.Limit))
	}
	switch c.Mode {
	case Classifying, Blocking, "":
	default:
		errs = append(errs, fmt.Errorf("gate_params.gating_mode: %q is neither %s nor %s", c.Mode, Blocking, Classifying))
	}
	return errors.Join(errs...)
}

// Gate is the in-process concurrency cap. It is safe for concurrent use.
type Gate struct {
	cfg Config
	// slots holds one token per admitted request: len is inFlight.
	slots chan struct{}
}

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Admitter  = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
)

// New returns the gate.
func New(cfg Config) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Gate{cfg: cfg, slots: make(chan struct{}, cfg.Limit)}, nil
}

// Factory builds the gate from gate_params: limit (required), gating_mode.
func Factory(p gate.Params, _ gate.Env) (gate.Gate, error) {
	var cfg Config
	var err error
	if !p.Has("limit") {
		return nil, errors.New("gate_params.limit is required (an integer > 0)")
	}
	if cfg.Limit, err = p.Int("limit", 0); err != nil {
		return nil, err
	}
	cfg.Mode = Mode(p.String("gating_mode", string(Classifying)))
	if err := p.Unused(); err != nil {
		return nil, err
	}
	return New(cfg)
}

// InFlight returns how many admitted requests hold a slot.
func (g *Gate) InFlight() int { return len(g.slots) }

// Budget is 1 while a slot is free and 0 when all are taken. Upstream
// reports the free share, (limit − inFlight) / limit, which shrinks its
// per-tick batch; in sluice a budget scales the in-flight limit, which the
// slots already are, and a share would compound with it (in flight would
// settle near MC·L/(MC+L) instead of L), so the gate only opens or closes.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(g.slots) >= g.cfg.Limit {
		return 0, nil
	}
	return 1, nil
}

// Admit takes a slot for req: Admit with the Release that frees it; when
// none is free, Defer (classifying) or a wait for one until ctx ends
// (blocking: then an error wrapping ctx's).
func (g *Gate) Admit(ctx context.Context, _ *wire.Request) (gate.Decision, error) {
	select {
	case g.slots <- struct{}{}:
		return gate.Decision{Verdict: gate.Admit, Release: g.release()}, nil
	default:
	}
	if g.cfg.Mode == Classifying {
		return gate.Decision{Verdict: gate.Defer, Reason: fmt.Sprintf("local concurrency limit %d reached", g.cfg.Limit)}, nil
	}
	if err := ctx.Err(); err != nil {
		return gate.Decision{}, fmt.Errorf("local-max-concurrency: waiting for one of %d slots: %w", g.cfg.Limit, err)
	}
	select {
	case g.slots <- struct{}{}:
		return gate.Decision{Verdict: gate.Admit, Release: g.release()}, nil
	case <-ctx.Done():
		return gate.Decision{}, fmt.Errorf("local-max-concurrency: waiting for one of %d slots: %w", g.cfg.Limit, ctx.Err())
	}
}

// release returns the function that frees one slot, once however often it
// is called.
func (g *Gate) release() func() {
	return sync.OnceFunc(func() { <-g.slots })
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	what := "defers requests"
	if g.cfg.Mode == Blocking {
		what = "holds requests until a slot frees or their deadline"
	}
	return fmt.Sprintf("when %d requests admitted by this process are in flight (budget = free slots / %d); then %s (%s)",
		g.cfg.Limit, g.cfg.Limit, what, g.cfg.Mode)
}
