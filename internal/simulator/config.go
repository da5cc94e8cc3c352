package simulator

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"time"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultRetryAfter      = time.Second
	DefaultCapacity        = 64
	DefaultStatus5xx       = 503
	DefaultMaxBodyBytes    = 16 << 20
	DefaultShutdownTimeout = 5 * time.Second
)

// Config says how a simulated gateway behaves. The zero value is a valid
// gateway that answers every request at once with 200.
type Config struct {
	// Latency is how long a completion request waits before it is answered,
	// whatever its outcome. The zero value means no latency.
	Latency LatencyDist
	// Rate429 is the fraction of completion requests answered
	// 429 Too Many Requests with a Retry-After header.
	Rate429 float64
	// RetryAfter is the value of the Retry-After header of a 429, sent as whole
	// seconds (rounded up). Zero means DefaultRetryAfter.
	RetryAfter time.Duration
	// Rate5xx is the fraction of completion requests answered Status5xx.
	Rate5xx float64
	// Status5xx is the status of a sampled server error, in [500,599].
	// Zero means DefaultStatus5xx (503).
	Status5xx int
	// RateReset is the fraction of completion requests whose connection is
	// reset (closed with SO_LINGER 0) without any response.
	RateReset float64
	// Capacity is the simulated pool capacity behind the vLLM-style gauges:
	// running = min(inflight, Capacity), waiting = max(0, inflight-Capacity).
	// It does not limit concurrency. Zero means DefaultCapacity.
	Capacity int
	// Seed makes the sampled outcomes and latencies deterministic: with the same
	// non-zero seed, the n-th completion request gets the same draw. Zero picks
	// a random seed.
	Seed int64
	// MaxBodyBytes bounds a request body; larger bodies are answered 413.
	// Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// ShutdownTimeout bounds how long Close waits for requests in flight
	// before it aborts them. Zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

func (c *Config) setDefaults() {
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Status5xx == 0 {
		c.Status5xx = DefaultStatus5xx
	}
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
}

// Validate reports every invalid field: rates outside [0,1] or summing above 1,
// negative durations or sizes, a Status5xx outside [500,599] and an invalid
// latency distribution. Zero values are valid (they mean the defaults).
func (c *Config) Validate() error {
	var errs []error
	rate := func(name string, v float64) {
		if !(v >= 0 && v <= 1) { // also rejects NaN
			errs = append(errs, fmt.Errorf("%s is %v, want a fraction in [0,1]", name, v))
		}
	}
	rate("rate-429", c.Rate429)
	rate("rate-5xx", c.Rate5xx)
	rate("rate-reset", c.RateReset)
	if sum := c.Rate429 + c.Rate5xx + c.RateReset; sum > 1+1e-9 {
		errs = append(errs, fmt.Errorf("rate-429 + rate-5xx + rate-reset is %v, want at most 1", sum))
	}
	if c.RetryAfter < 0 {
		errs = append(errs, fmt.Errorf("retry-after is %v, want >= 0", c.RetryAfter))
	}
	if c.Status5xx != 0 && (c.Status5xx < 500 || c.Status5xx > 599) {
		errs = append(errs, fmt.Errorf("status-5xx is %d, want a status in [500,599]", c.Status5xx))
	}
	if c.Capacity < 0 {
		errs = append(errs, fmt.Errorf("capacity is %d, want >= 0", c.Capacity))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes is %d, want >= 0", c.MaxBodyBytes))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout is %v, want >= 0", c.ShutdownTimeout))
	}
	if err := c.Latency.validate(); err != nil {
		errs = append(errs, fmt.Errorf("latency: %w", err))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("simulator config: %w", errors.Join(errs...))
}

// RegisterFlags registers the flags of `sluice simulate-gateway` on fs, bound
// to c. Values already in c are the flags' defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(&latencyFlag{cfg: c}, "latency",
		"simulated latency of each completion request, a Go duration (e.g. 50ms); with --latency-jitter, the centre of the range")
	fs.Var(&latencyFlag{cfg: c, jitter: true}, "latency-jitter",
		"spread of the latency, a Go duration: each request waits a uniform draw in [latency-jitter, latency+jitter]")
	fs.Float64Var(&c.Rate429, "rate-429", c.Rate429,
		"fraction of completion requests answered 429 Too Many Requests, in [0,1]")
	retryAfter := c.RetryAfter
	if retryAfter == 0 {
		retryAfter = DefaultRetryAfter
	}
	fs.DurationVar(&c.RetryAfter, "retry-after", retryAfter,
		"Retry-After of a 429 answer, a Go duration sent as whole seconds (rounded up)")
	fs.Float64Var(&c.Rate5xx, "rate-5xx", c.Rate5xx,
		"fraction of completion requests answered with a server error (503), in [0,1]")
	fs.Float64Var(&c.RateReset, "rate-reset", c.RateReset,
		"fraction of completion requests whose TCP connection is reset without a response, in [0,1]")
	capacity := c.Capacity
	if capacity == 0 {
		capacity = DefaultCapacity
	}
	fs.IntVar(&c.Capacity, "capacity", capacity,
		"simulated pool capacity behind the vllm:num_requests_running/waiting and kv-cache gauges")
	fs.Int64Var(&c.Seed, "seed", c.Seed,
		"seed for the sampled outcomes and latencies; 0 picks a random seed")
}

// latencyFlag is the flag.Value of --latency (jitter false) and
// --latency-jitter (jitter true). Both edit cfg.Latency: the pair
// (latency, jitter) is read back from the distribution, so the order of the
// flags does not matter.
type latencyFlag struct {
	cfg    *Config
	jitter bool
}

func (f *latencyFlag) String() string {
	if f == nil || f.cfg == nil {
		return "0s"
	}
	centre, spread := f.cfg.Latency.centreSpread()
	if f.jitter {
		return spread.String()
	}
	return centre.String()
}

func (f *latencyFlag) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err // the flag package adds the flag's name
	}
	if d < 0 {
		return fmt.Errorf("%v is negative", d)
	}
	centre, spread := f.cfg.Latency.centreSpread()
	if f.jitter {
		spread = d
	} else {
		centre = d
	}
	switch {
	case spread > 0:
		f.cfg.Latency = Uniform(centre-spread, centre+spread)
	case centre > 0:
		f.cfg.Latency = Fixed(centre)
	default:
		f.cfg.Latency = LatencyDist{}
	}
	return nil
}

type latencyKind uint8

const (
	latencyNone latencyKind = iota
	latencyFixed
	latencyUniform
	latencyLogNormal
)

// z99 is the 0.99 quantile of the standard normal distribution.
const z99 = 2.3263478740408408

// LatencyDist is a distribution of simulated latencies. The zero value means
// no latency; build others with Fixed, Uniform and LogNormal.
type LatencyDist struct {
	kind latencyKind
	a, b time.Duration // fixed: a; uniform: [a,b]; lognormal: median a, p99 b
	mu   float64       // lognormal: ln(median in ns)
	sig  float64       // lognormal: sigma
}

// Fixed is a latency of exactly d.
func Fixed(d time.Duration) LatencyDist {
	return LatencyDist{kind: latencyFixed, a: d}
}

// Uniform is a latency drawn uniformly from [minD, maxD].
func Uniform(minD, maxD time.Duration) LatencyDist {
	return LatencyDist{kind: latencyUniform, a: minD, b: maxD}
}

// LogNormal is a log-normal latency with the given median and 99th percentile,
// the usual shape of LLM serving times (a long right tail).
func LogNormal(median, p99 time.Duration) LatencyDist {
	l := LatencyDist{kind: latencyLogNormal, a: median, b: p99}
	if median > 0 && p99 >= median {
		l.mu = math.Log(float64(median))
		l.sig = math.Log(float64(p99)/float64(median)) / z99
	}
	return l
}

// String describes the distribution, e.g. "uniform(40ms,60ms)".
func (l LatencyDist) String() string {
	switch l.kind {
	case latencyFixed:
		return fmt.Sprintf("fixed(%v)", l.a)
	case latencyUniform:
		return fmt.Sprintf("uniform(%v,%v)", l.a, l.b)
	case latencyLogNormal:
		return fmt.Sprintf("lognormal(median=%v,p99=%v)", l.a, l.b)
	default:
		return "none"
	}
}

func (l LatencyDist) validate() error {
	switch l.kind {
	case latencyFixed:
		if l.a < 0 {
			return fmt.Errorf("fixed latency %v is negative", l.a)
		}
	case latencyUniform:
		if l.a < 0 {
			return fmt.Errorf("uniform latency minimum %v is negative (is the jitter larger than the latency?)", l.a)
		}
		if l.b < l.a {
			return fmt.Errorf("uniform latency maximum %v is below its minimum %v", l.b, l.a)
		}
	case latencyLogNormal:
		if l.a <= 0 {
			return fmt.Errorf("log-normal median %v must be positive", l.a)
		}
		if l.b < l.a {
			return fmt.Errorf("log-normal p99 %v is below its median %v", l.b, l.a)
		}
	}
	return nil
}

// centreSpread reads a distribution back as the (--latency, --latency-jitter)
// pair of the flags.
func (l LatencyDist) centreSpread() (centre, spread time.Duration) {
	switch l.kind {
	case latencyFixed, latencyLogNormal:
		return l.a, 0
	case latencyUniform:
		return l.a + (l.b-l.a)/2, (l.b - l.a) / 2
	default:
		return 0, 0
	}
}

// sample draws one latency using r.
func (l *LatencyDist) sample(r *rng) time.Duration {
	switch l.kind {
	case latencyFixed:
		return l.a
	case latencyUniform:
		if l.b <= l.a {
			return l.a
		}
		return l.a + time.Duration(r.float64()*float64(l.b-l.a))
	case latencyLogNormal:
		// Box–Muller; 1-u keeps the logarithm finite.
		u1, u2 := 1-r.float64(), r.float64()
		z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
		ns := math.Exp(l.mu + l.sig*z)
		if ns >= math.MaxInt64 {
			return math.MaxInt64
		}
		return time.Duration(ns)
	default:
		return 0
	}
}

// rng is a splitmix64 stream: a few cheap draws per request with no shared
// state, so the hot path needs no lock.
type rng struct{ s uint64 }

// newRNG returns the stream of the n-th request of a server seeded with seed.
func newRNG(seed, n uint64) rng {
	return rng{s: mix64(seed ^ mix64(n))}
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// float64 returns a draw in [0,1).
func (r *rng) float64() float64 {
	return float64(r.next()>>11) / (1 << 53)
}

func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
