package aimd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Defaults of the parameters (upstream's, where its spec names one).
const (
	DefaultMinWindow            = 1.0
	DefaultMaxWindow            = 256.0
	DefaultIncrease             = 1.0
	DefaultDecreaseFactor       = 0.5
	DefaultGentleDecreaseFactor = 0.9
	DefaultHoldDuration         = time.Second
	DefaultDeferDelay           = 100 * time.Millisecond
	DefaultRefreshInterval      = 10 * time.Millisecond
	DefaultDroppedReasonHeader  = "x-llm-d-request-dropped-reason"
	DefaultQueueDurationHeader  = "x-llm-d-flow-queue-duration-ms"
	DefaultHeadroomHeader       = "x-llm-d-flow-band-headroom"
)

// BandConfig overrides the window bounds of one band; a zero field keeps
// the gate-wide value.
type BandConfig struct {
	// MinWindow is the band's smallest window.
	MinWindow float64 `json:"min_window,omitempty"`
	// MaxWindow is the band's largest window.
	MaxWindow float64 `json:"max_window,omitempty"`
	// InitialWindow is the band's window before any answer.
	InitialWindow float64 `json:"initial_window,omitempty"`
}

// Config configures a Gate. Zero fields take their defaults (SetDefaults).
type Config struct {
	// MinWindow is the smallest window of a band (default 1, at least 1): a
	// saturated band still probes with that many requests.
	MinWindow float64
	// MaxWindow is the largest window of a band (default 256).
	MaxWindow float64
	// InitialWindow is a band's window before any answer (default MinWindow).
	InitialWindow float64
	// SlowStartThreshold is a band's ssthresh before its first decrease
	// (default MaxWindow: a fresh band opens in slow start).
	SlowStartThreshold float64
	// Increase is what an accepted request adds: in slow start (window
	// below ssthresh) Increase, then Increase/window (default 1).
	Increase float64
	// DecreaseFactor multiplies the window on a capacity rejection
	// (rejected-saturated or a bare 429), at most once per flight (default
	// 0.5, in (0,1)).
	DecreaseFactor float64
	// GentleDecreaseFactor multiplies the window on a queue-TTL expiry
	// (rejected-ttl-expired) and on a queue duration past twice
	// QueueDurationTarget (default 0.9, in (0,1]).
	GentleDecreaseFactor float64
	// HoldDuration is how long a rejection below a band holds that band's
	// growth (default 1s; negative: no holds).
	HoldDuration time.Duration
	// QueueDurationTarget, when > 0, makes an accepted answer whose
	// QueueDurationHeader exceeds it hold the window, and one past twice it
	// decrease gently (default 0: off).
	QueueDurationTarget time.Duration
	// DeferDelay is how long a request refused because its band is full
	// waits before it is asked again (default 100ms).
	DeferDelay time.Duration
	// RefreshInterval is how often the credits follow the windows (default
	// 10ms; the generic refresh_interval parameter overrides it).
	RefreshInterval time.Duration
	// TierLabel is the request label holding the tier (default "tier").
	TierLabel string
	// DroppedReasonHeader is the response header carrying the gateway's
	// reason for a rejection (default x-llm-d-request-dropped-reason).
	DroppedReasonHeader string
	// NoFlowHeaders turns off the optional flow-control headers
	// (QueueDurationHeader, HeadroomHeader), which are read by default.
	NoFlowHeaders bool
	// QueueDurationHeader is the response header with the time, in
	// milliseconds, the request queued in the gateway (default
	// x-llm-d-flow-queue-duration-ms).
	QueueDurationHeader string
	// HeadroomHeader is the response header with the free queue capacity,
	// in requests, of the band the request occupied (default
	// x-llm-d-flow-band-headroom).
	HeadroomHeader string
	// Bands overrides the window bounds per band, keyed by band name
	// ("reserved-interactive" … "overflow-batch").
	Bands map[string]BandConfig
	// MaxConcurrency is the requests in flight at budget 1 (the queue's
	// max_concurrency, or the pool's workers): the budget is the open
	// windows over it. 0: MaxWindow.
	MaxConcurrency int
	// Now is the clock (default time.Now), for tests.
	Now func() time.Time
}

// SetDefaults fills zero fields with their defaults.
func (c *Config) SetDefaults() {
	if c.MinWindow == 0 {
		c.MinWindow = DefaultMinWindow
	}
	if c.MaxWindow == 0 {
		c.MaxWindow = DefaultMaxWindow
	}
	if c.InitialWindow == 0 {
		c.InitialWindow = c.MinWindow
	}
	if c.SlowStartThreshold == 0 {
		c.SlowStartThreshold = c.MaxWindow
	}
	if c.Increase == 0 {
		c.Increase = DefaultIncrease
	}
	if c.DecreaseFactor == 0 {
		c.DecreaseFactor = DefaultDecreaseFactor
	}
	if c.GentleDecreaseFactor == 0 {
		c.GentleDecreaseFactor = DefaultGentleDecreaseFactor
	}
	if c.DeferDelay == 0 {
		c.DeferDelay = DefaultDeferDelay
	}
	if c.HoldDuration == 0 {
		c.HoldDuration = DefaultHoldDuration
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.TierLabel == "" {
		c.TierLabel = wire.DefaultTierLabel
	}
	if c.DroppedReasonHeader == "" {
		c.DroppedReasonHeader = DefaultDroppedReasonHeader
	}
	if c.QueueDurationHeader == "" {
		c.QueueDurationHeader = DefaultQueueDurationHeader
	}
	if c.HeadroomHeader == "" {
		c.HeadroomHeader = DefaultHeadroomHeader
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every unusable value, naming its parameter.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if !finite(c.MinWindow) || c.MinWindow < 1 {
		bad("gate_params.min_window: %v must be ≥ 1", c.MinWindow)
	}
	if !finite(c.MaxWindow) || c.MaxWindow < c.MinWindow {
		bad("gate_params.max_window: %v must be ≥ min_window %v", c.MaxWindow, c.MinWindow)
	}
	if !finite(c.InitialWindow) || c.InitialWindow < c.MinWindow || c.InitialWindow > c.MaxWindow {
		bad("gate_params.initial_window: %v must lie in [min_window %v, max_window %v]", c.InitialWindow, c.MinWindow, c.MaxWindow)
	}
	if !finite(c.SlowStartThreshold) || c.SlowStartThreshold < c.MinWindow {
		bad("gate_params.slow_start_threshold: %v must be ≥ min_window %v", c.SlowStartThreshold, c.MinWindow)
	}
	if !finite(c.Increase) || c.Increase <= 0 {
		bad("gate_params.increase: %v must be > 0", c.Increase)
	}
	if !(c.DecreaseFactor > 0 && c.DecreaseFactor < 1) {
		bad("gate_params.decrease_factor: %v must lie in (0,1)", c.DecreaseFactor)
	}
	if !(c.GentleDecreaseFactor > 0 && c.GentleDecreaseFactor <= 1) {
		bad("gate_params.gentle_decrease_factor: %v must lie in (0,1]", c.GentleDecreaseFactor)
	}
	if c.QueueDurationTarget < 0 {
		bad("gate_params.queue_duration_target: %v is negative", c.QueueDurationTarget)
	}
	if c.DeferDelay < time.Millisecond {
		bad("gate_params.defer_delay: %v is below 1ms", c.DeferDelay)
	}
	if c.RefreshInterval < time.Millisecond {
		bad("refresh interval %v is below 1ms", c.RefreshInterval)
	}
	for key, name := range map[string]string{
		"dropped_reason_header": c.DroppedReasonHeader, "queue_duration_header": c.QueueDurationHeader, "headroom_header": c.HeadroomHeader,
	} {
		if !httpguts.ValidHeaderFieldName(name) {
			bad("gate_params.%s: %q is not a valid header name", key, name)
		}
	}
	if c.MaxConcurrency < 0 {
		bad("max concurrency %d is negative", c.MaxConcurrency)
	}
	for _, name := range sortedKeys(c.Bands) {
		i := slices.Index(bandNames[:], name)
		if i < 0 {
			bad("gate_params.bands: unknown band %q (want one of %s)", name, strings.Join(bandNames[:], ", "))
			continue
		}
		lo, hi, init := c.bandBounds(i)
		switch {
		case !finite(lo) || lo < 1:
			bad("gate_params.bands.%s.min_window: %v must be ≥ 1", name, lo)
		case !finite(hi) || hi < lo:
			bad("gate_params.bands.%s.max_window: %v must be ≥ its min_window %v", name, hi, lo)
		case !finite(init) || init < lo || init > hi:
			bad("gate_params.bands.%s.initial_window: %v must lie in [%v, %v]", name, init, lo, hi)
		}
	}
	return errors.Join(errs...)
}

// bandBounds returns band i's min, max and initial window.
func (c Config) bandBounds(i int) (lo, hi, init float64) {
	lo, hi, init = c.MinWindow, c.MaxWindow, c.InitialWindow
	if o, ok := c.Bands[bandNames[i]]; ok {
		if o.MinWindow != 0 {
			lo = o.MinWindow
		}
		if o.MaxWindow != 0 {
			hi = o.MaxWindow
		}
		switch {
		case o.InitialWindow != 0:
			init = o.InitialWindow
		default:
			init = min(max(init, lo), hi)
		}
	}
	return lo, hi, init
}

func sortedKeys(m map[string]BandConfig) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Factory builds the gate from gate_params (every parameter optional):
// min_window, max_window, initial_window, slow_start_threshold, increase,
// decrease_factor, gentle_decrease_factor, hold_duration,
// queue_duration_target, defer_delay, tier_label, dropped_reason_header,
// flow_headers, queue_duration_header, headroom_header, bands. The budget
// is the open windows over env.MaxConcurrency.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	cfg := Config{MaxConcurrency: env.MaxConcurrency}
	var errs []error
	num := func(key string, dst *float64) {
		v, err := p.Float(key, 0)
		if err != nil {
			errs = append(errs, err)
			return
		}
		if p.Has(key) && v == 0 {
			errs = append(errs, fmt.Errorf("gate_params.%s: 0 is not allowed (leave it out for the default)", key))
		}
		*dst = v
	}
	dur := func(key string, dst *time.Duration) {
		v, err := p.Duration(key, 0)
		if err != nil {
			errs = append(errs, err)
			return
		}
		*dst = v
	}
	num("min_window", &cfg.MinWindow)
	num("max_window", &cfg.MaxWindow)
	num("initial_window", &cfg.InitialWindow)
	num("slow_start_threshold", &cfg.SlowStartThreshold)
	num("increase", &cfg.Increase)
	num("decrease_factor", &cfg.DecreaseFactor)
	num("gentle_decrease_factor", &cfg.GentleDecreaseFactor)
	dur("hold_duration", &cfg.HoldDuration)
	if cfg.HoldDuration < 0 {
		errs = append(errs, fmt.Errorf("gate_params.hold_duration: %v is negative", cfg.HoldDuration))
	}
	if p.Has("hold_duration") && cfg.HoldDuration == 0 {
		cfg.HoldDuration = -1 // "0s": no holds
	}
	dur("queue_duration_target", &cfg.QueueDurationTarget)
	dur("defer_delay", &cfg.DeferDelay)
	if p.Has("defer_delay") && cfg.DeferDelay == 0 {
		cfg.DeferDelay = -1 // "0s": refused by Validate, not the default
	}
	cfg.TierLabel = p.String("tier_label", wire.DefaultTierLabel)
	cfg.DroppedReasonHeader = p.String("dropped_reason_header", DefaultDroppedReasonHeader)
	cfg.QueueDurationHeader = p.String("queue_duration_header", DefaultQueueDurationHeader)
	cfg.HeadroomHeader = p.String("headroom_header", DefaultHeadroomHeader)
	switch v := p.String("flow_headers", "true"); v {
	case "true":
	case "false":
		cfg.NoFlowHeaders = true
	default:
		errs = append(errs, fmt.Errorf("gate_params.flow_headers: %q is neither true nor false", v))
	}
	if raw := p.Raw("bands"); raw != nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg.Bands); err != nil {
			errs = append(errs, fmt.Errorf("gate_params.bands: want an object of band name → {min_window, max_window, initial_window}: %w", err))
		}
	} else if p.Has("bands") {
		errs = append(errs, errors.New("gate_params.bands: want an object of band name → {min_window, max_window, initial_window}"))
	}
	if err := p.Unused(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	g, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := g.RegisterMetrics(env.Metrics); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return g, nil
}
