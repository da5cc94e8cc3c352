package poolsim

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults applied by SetDefaults to zero-valued fields: the pool of
// section 5.4 of the design notes (2 pods × 16 seats), small enough for a
// 2-core machine to keep up with at full load.
const (
	DefaultPods                 = 2
	DefaultModelName            = "sim-model"
	DefaultMaxNumSeqs           = 16
	DefaultMaxNumBatchedTokens  = 2048
	DefaultBlockSize            = 16
	DefaultKVTokens             = 12288
	DefaultMaxModelLen          = 4096
	DefaultITL                  = 10 * time.Millisecond
	DefaultLoadFactor           = 2.0
	DefaultPrefillPerToken      = 50 * time.Microsecond
	DefaultPrefillOverhead      = 10 * time.Millisecond
	DefaultMaxTokens            = 16 // OpenAI's default for /v1/completions
	DefaultBatchPriority        = 10
	DefaultPoolName             = "sim-pool"
	DefaultQueueDepthThreshold  = 5
	DefaultKVCacheUtilThreshold = 0.8
	DefaultStalenessThreshold   = 200 * time.Millisecond
	DefaultMaxConcurrency       = 100
	DefaultRefreshInterval      = 50 * time.Millisecond
	DefaultFlushInterval        = 5 * time.Second
	DefaultCeiling              = 1.0
	DefaultHoldbackMin          = 0.5
	DefaultBandCapacity         = 1000
	DefaultRequestTTL           = 30 * time.Second
	DefaultMaxBodyBytes         = 16 << 20
	DefaultShutdownTimeout      = 5 * time.Second
)

// Scheduling policies of an engine's waiting queue (vLLM --scheduling-policy).
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

// Step models (EngineConfig.StepModel).
const (
	// StepModelLoad is ITL0·(1 + (F−1)·(n−1)/(max_num_seqs−1)) + c_p·p +
	// o_p·k + c_d·d: inference-sim's load-factor form.
	StepModelLoad = "load"
	// StepModelLinear is ITL0 + c_p·p + c_d·d: BLIS's regression form
	// (β0 + β1·uncached prefill tokens + β2·decode tokens), trained on
	// measured vLLM steps.
	StepModelLinear = "linear"
)

// Output-length modes (EngineConfig.OutputLength).
const (
	// OutputMax generates exactly max_tokens tokens (finish_reason "length"),
	// as vLLM with ignore_eos.
	OutputMax = "max"
	// OutputUniform draws the length uniformly in [1, max_tokens] from the
	// seed and the request's number; shorter answers finish with "stop".
	OutputUniform = "uniform"
)

// Front modes (FrontConfig.Mode).
const (
	// ModePassthrough routes every request at once.
	ModePassthrough = "passthrough"
	// ModeLegacyAdmission rejects sheddable requests (priority < 0) with 429
	// rejected-saturated while the pool saturation is ≥ 1, as the EPP does
	// with flow control off.
	ModeLegacyAdmission = "legacy-admission"
	// ModeFlowControl holds requests in priority bands and dispatches them
	// while the saturation is below the band's ceiling.
	ModeFlowControl = "flow-control"
)

// Saturation detectors (FrontConfig.Detector).
const (
	DetectorUtilization = "utilization"
	DetectorConcurrency = "concurrency"
)

// Ceiling policies of flow control (FrontConfig.CeilingPolicy).
const (
	// CeilingStatic gives every band the same ceiling (FrontConfig.Ceiling).
	CeilingStatic = "static"
	// CeilingPriorityHoldback steps the ceiling down by band rank, from
	// Ceiling for the highest band to HoldbackMin for the lowest.
	CeilingPriorityHoldback = "priority-holdback"
)

// Config configures a simulated pool. The zero value (after SetDefaults) is
// the default pool.
type Config struct {
	// Pods is the number of engine pods (default DefaultPods).
	Pods int
	// ModelName is the model_name label of the vLLM series and the model of
	// answers whose request names none (default DefaultModelName).
	ModelName string
	// Seed makes the simulation deterministic: step jitter, output lengths and
	// routing ties are drawn from it. Zero picks a random seed.
	Seed int64
	// Engine configures every pod's engine.
	Engine EngineConfig
	// Front configures the EPP-like front.
	Front FrontConfig
	// MaxBodyBytes bounds a request body; larger ones get 413 (default
	// DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// ShutdownTimeout bounds how long Close waits for requests in flight
	// (default DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
}

// EngineConfig is one pod's vLLM-V1-like engine.
type EngineConfig struct {
	// MaxNumSeqs is the number of seats: requests running at once (vLLM
	// --max-num-seqs; default DefaultMaxNumSeqs).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step (vLLM
	// --max-num-batched-tokens; default DefaultMaxNumBatchedTokens).
	MaxNumBatchedTokens int
	// LongPrefillThreshold caps the tokens one request gets in a step (vLLM
	// --long-prefill-token-threshold); zero means no cap.
	LongPrefillThreshold int
	// DisableChunkedPrefill turns chunked prefill off: a waiting request whose
	// prompt does not fit in the budget left ends the waiting pass.
	DisableChunkedPrefill bool
	// BlockSize is the KV block size in tokens (default DefaultBlockSize).
	BlockSize int
	// KVTokens is the KV capacity of one pod in tokens, rounded down to whole
	// blocks (default DefaultKVTokens).
	KVTokens int
	// KVBlocks, when positive, sets the KV capacity in blocks instead:
	// KVTokens becomes KVBlocks × BlockSize (vLLM reports its capacity as
	// num_gpu_blocks).
	KVBlocks int
	// MaxModelLen bounds prompt + max_tokens; longer requests get 400
	// (default DefaultMaxModelLen; at most KVTokens).
	MaxModelLen int
	// Policy is PolicyFCFS (default) or PolicyPriority.
	Policy string
	// SeatPreempt (PolicyPriority only) lets a waiting request of strictly
	// higher priority preempt the lowest-priority running one when every
	// seat is taken, as the open vLLM PRs #45561/#54530 propose; vLLM V1
	// does not. An upper-bound arm for engine-side protection.
	SeatPreempt bool
	// PreemptKeep lets a preempted sequence keep its computed tokens (as
	// if its KV were swapped out and back in at no cost), so it resumes
	// where it stopped instead of recomputing its prompt and output. No
	// vLLM V1 engine does this for free: with SeatPreempt it is the
	// oracle arm, the best any dispatcher or engine could do on this pool.
	PreemptKeep bool
	// PrefixCaching keeps the KV blocks of a sequence that left the engine
	// cached for a later one whose text starts with its text, as vLLM V1's
	// automatic prefix caching (prefix.go; vLLM's --enable-prefix-caching,
	// on by default there; off by default here, so the older figures keep
	// their meaning). Only text prompts are compared.
	PrefixCaching bool
	// StepModel is StepModelLoad (default: today's inference-sim form, with
	// the load factor and a charge per starting prefill) or StepModelLinear
	// (BLIS's form: ITL + PrefillPerToken·p + DecodePerToken·d; LoadFactor
	// and PrefillOverhead are ignored).
	StepModel string
	// ITL is ITL0, the step time with one sequence and no prefill
	// (inference-sim's inter-token-latency; default DefaultITL).
	ITL time.Duration
	// LoadFactor is F, the step-time factor at MaxNumSeqs sequences
	// (inference-sim's time-factor-under-load; default DefaultLoadFactor).
	LoadFactor float64
	// PrefillPerToken is c_p, the cost of one prompt token in a step
	// (inference-sim's prefill-time-per-token; default DefaultPrefillPerToken).
	PrefillPerToken time.Duration
	// PrefillOverhead is o_p, the cost of each request whose prefill starts in
	// a step (inference-sim's prefill-overhead; default DefaultPrefillOverhead).
	PrefillOverhead time.Duration
	// DecodePerToken is c_d, the cost of each decode token in a step
	// (BLIS's β2; zero by default, where LoadFactor models the decode load
	// instead).
	DecodePerToken time.Duration
	// RequestOverhead is CPU time a request spends outside the step loop
	// (HTTP parsing, tokenization, queue insertion: BLIS's α0) between its
	// routing and its arrival in the pod's waiting queue; it delays the
	// request, not the steps (default zero).
	RequestOverhead time.Duration
	// StepJitter spreads each step's duration uniformly by ±StepJitter of
	// itself, in [0,1); zero means none.
	StepJitter float64
	// DefaultMaxTokens is the max_tokens of a request whose body has none
	// (default DefaultMaxTokens).
	DefaultMaxTokens int
	// OutputLength is OutputMax (default) or OutputUniform.
	OutputLength string
	// InteractivePriority and BatchPriority are the engine priorities (lower
	// runs first, as vLLM) of requests whose body has no "priority"; they
	// matter only with PolicyPriority. BatchPriority zero means
	// DefaultBatchPriority.
	InteractivePriority int
	BatchPriority       int
	// IgnoreHangups makes the HTTP server run a request whose client went
	// away to its end, as servers that do not watch their connections do
	// (llm-d-inference-sim): its seat and blocks stay taken until then, and
	// it is counted as finished by its length or stop, never as an abort.
	// Off (the default), a client that goes away frees its request at the
	// pod's next step and it counts in finished_reason="abort".
	// Pool.SetIgnoreHangups changes it while the pool runs.
	IgnoreHangups bool
}

// Objective is what the front knows of one inference objective (the value
// of the objective header).
type Objective struct {
	// Priority is the EPP priority: higher is more important; negative is
	// sheddable.
	Priority int
	// Class is the traffic class of requests with this objective.
	Class Class
}

// FrontConfig is the EPP-like front.
type FrontConfig struct {
	// Pool names the inference pool in the EPP series (default
	// DefaultPoolName).
	Pool string
	// Mode is ModePassthrough (default), ModeLegacyAdmission or
	// ModeFlowControl.
	Mode string
	// Detector is DetectorUtilization (default) or DetectorConcurrency.
	Detector string
	// QueueDepthThreshold and KVCacheUtilThreshold are the utilization
	// detector's thresholds (defaults 5 and 0.8).
	QueueDepthThreshold  float64
	KVCacheUtilThreshold float64
	// StalenessThreshold is the age past which a pod's metrics score 1.0
	// (default DefaultStalenessThreshold).
	StalenessThreshold time.Duration
	// MaxConcurrency is the concurrency detector's requests per pod (default
	// DefaultMaxConcurrency).
	MaxConcurrency int
	// RefreshInterval is how often the front reads the pods' gauges (the
	// EPP's RefreshMetricsInterval; default DefaultRefreshInterval).
	RefreshInterval time.Duration
	// FlushInterval is how often the inference_pool_* averages are written
	// (the EPP's RefreshPrometheusMetricsInterval; default
	// DefaultFlushInterval).
	FlushInterval time.Duration
	// Objectives maps objective names to priority and class; nil means
	// DefaultObjectives. Unknown objectives get priority 0, class batch when
	// the name contains "batch", interactive otherwise.
	Objectives map[string]Objective
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up) on rejected-saturated 429s. The EPP sends none, so the
	// default is zero: no header.
	RetryAfter time.Duration
	// CeilingPolicy is CeilingStatic (default) or CeilingPriorityHoldback.
	CeilingPolicy string
	// Ceiling is the static ceiling, and the holdback policy's highest
	// (default DefaultCeiling).
	Ceiling float64
	// HoldbackMin is the holdback policy's ceiling for the lowest band
	// (default DefaultHoldbackMin).
	HoldbackMin float64
	// BandCapacity is how many requests one flow-control band holds; more
	// get 429 (default DefaultBandCapacity).
	BandCapacity int
	// RequestTTL is how long a request may wait in a band before it gets 503
	// rejected-ttl-expired; an x-slo-ttft-ms header sets a shorter one
	// (default DefaultRequestTTL).
	RequestTTL time.Duration

	objectivesFromFlag bool // --objective was given: its first use replaced the map
	// PrefixAware routes a request whose text prompt shares at least four
	// KV blocks with one routed to a pod lately to that pod, unless it has
	// more than one waiting request beyond the pod the load picks: the
	// EPP's approximate prefix-cache scorer (off by default). With the
	// engines' PrefixCaching it sends a resumed request back to the pod
	// that holds its blocks.
	PrefixAware bool
}

// DefaultObjectives returns the objective map used when
// FrontConfig.Objectives is nil: batch-gateway's CRD values.
func DefaultObjectives() map[string]Objective {
	return map[string]Objective{
		"interactive-default": {Priority: 100, Class: ClassInteractive},
		"interactive":         {Priority: 100, Class: ClassInteractive},
		"batch-sheddable":     {Priority: -1, Class: ClassBatch},
		"batch":               {Priority: -1, Class: ClassBatch},
	}
}

// SetDefaults replaces zero-valued fields by their defaults.
func (c *Config) SetDefaults() {
	setDefault(&c.Pods, DefaultPods)
	setDefault(&c.ModelName, DefaultModelName)
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	e := &c.Engine
	setDefault(&e.MaxNumSeqs, DefaultMaxNumSeqs)
	setDefault(&e.MaxNumBatchedTokens, DefaultMaxNumBatchedTokens)
	setDefault(&e.BlockSize, DefaultBlockSize)
	if e.KVBlocks > 0 {
		e.KVTokens = e.KVBlocks * e.BlockSize
	}
	setDefault(&e.KVTokens, DefaultKVTokens)
	setDefault(&e.MaxModelLen, min(DefaultMaxModelLen, e.KVTokens))
	setDefault(&e.Policy, PolicyFCFS)
	setDefault(&e.ITL, DefaultITL)
	setDefault(&e.LoadFactor, DefaultLoadFactor)
	setDefault(&e.PrefillPerToken, DefaultPrefillPerToken)
	setDefault(&e.PrefillOverhead, DefaultPrefillOverhead)
	setDefault(&e.DefaultMaxTokens, DefaultMaxTokens)
	setDefault(&e.OutputLength, OutputMax)
	setDefault(&e.StepModel, StepModelLoad)
	setDefault(&e.BatchPriority, DefaultBatchPriority)
	f := &c.Front
	setDefault(&f.Pool, DefaultPoolName)
	setDefault(&f.Mode, ModePassthrough)
	setDefault(&f.Detector, DetectorUtilization)
	setDefault(&f.QueueDepthThreshold, DefaultQueueDepthThreshold)
	setDefault(&f.KVCacheUtilThreshold, DefaultKVCacheUtilThreshold)
	setDefault(&f.StalenessThreshold, DefaultStalenessThreshold)
	setDefault(&f.MaxConcurrency, DefaultMaxConcurrency)
	setDefault(&f.RefreshInterval, DefaultRefreshInterval)
	setDefault(&f.FlushInterval, DefaultFlushInterval)
	if f.Objectives == nil {
		f.Objectives = DefaultObjectives()
	}
	setDefault(&f.CeilingPolicy, CeilingStatic)
	setDefault(&f.Ceiling, DefaultCeiling)
	setDefault(&f.HoldbackMin, DefaultHoldbackMin)
	setDefault(&f.BandCapacity, DefaultBandCapacity)
	setDefault(&f.RequestTTL, DefaultRequestTTL)
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// Validate reports every invalid field. Zero values are valid (they mean
// the defaults); Validate checks the config as SetDefaults would leave it.
func (c Config) Validate() error {
	c.SetDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	positive := func(name string, v int) {
		if v <= 0 {
			bad("%s is %d, want > 0", name, v)
		}
	}
	positive("pods", c.Pods)
	if c.Pods > 1024 {
		bad("pods is %d, want at most 1024", c.Pods)
	}
	if c.MaxBodyBytes < 0 {
		bad("max body bytes is %d, want >= 0", c.MaxBodyBytes)
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown timeout is %v, want >= 0", c.ShutdownTimeout)
	}
	e := c.Engine
	positive("max-num-seqs", e.MaxNumSeqs)
	positive("max-num-batched-tokens", e.MaxNumBatchedTokens)
	positive("block-size", e.BlockSize)
	positive("max-model-len", e.MaxModelLen)
	positive("default-max-tokens", e.DefaultMaxTokens)
	if e.LongPrefillThreshold < 0 {
		bad("long-prefill-token-threshold is %d, want >= 0 (0: no cap)", e.LongPrefillThreshold)
	}
	if e.KVTokens < e.BlockSize {
		bad("kv-tokens is %d, want at least one block (%d tokens)", e.KVTokens, e.BlockSize)
	} else if e.MaxModelLen > e.KVTokens/e.BlockSize*e.BlockSize {
		bad("max-model-len %d exceeds the KV capacity of a pod (%d tokens): such a request could never run",
			e.MaxModelLen, e.KVTokens/e.BlockSize*e.BlockSize)
	}
	if e.DisableChunkedPrefill && e.MaxModelLen > e.MaxNumBatchedTokens {
		bad("with chunked prefill off, max-model-len %d must be at most max-num-batched-tokens %d", e.MaxModelLen, e.MaxNumBatchedTokens)
	}
	if e.Policy != PolicyFCFS && e.Policy != PolicyPriority {
		bad("scheduling-policy is %q, want %q or %q", e.Policy, PolicyFCFS, PolicyPriority)
	}
	if e.SeatPreempt && e.Policy != PolicyPriority {
		bad("seat-preempt needs scheduling-policy %q", PolicyPriority)
	}
	if c.Front.PrefixAware && !e.PrefixCaching {
		bad("prefix-aware-routing needs enable-prefix-caching: without the engines' cache it has nothing to find")
	}
	if e.ITL < 0 || e.PrefillPerToken < 0 || e.PrefillOverhead < 0 || e.DecodePerToken < 0 || e.RequestOverhead < 0 {
		bad("itl %v, prefill-time-per-token %v, prefill-overhead %v, decode-time-per-token %v and request-overhead %v must be >= 0",
			e.ITL, e.PrefillPerToken, e.PrefillOverhead, e.DecodePerToken, e.RequestOverhead)
	}
	if e.ITL == 0 && e.PrefillPerToken == 0 && e.PrefillOverhead == 0 && e.DecodePerToken == 0 {
		bad("itl, prefill-time-per-token, prefill-overhead and decode-time-per-token are all 0: a step would take no time")
	}
	if e.KVBlocks < 0 {
		bad("kv-blocks is %d, want >= 0 (0: use kv-tokens)", e.KVBlocks)
	}
	if !(e.LoadFactor >= 1) || math.IsInf(e.LoadFactor, 0) {
		bad("time-factor-under-load is %v, want a finite number >= 1", e.LoadFactor)
	}
	if !(e.StepJitter >= 0 && e.StepJitter < 1) {
		bad("step-jitter is %v, want a fraction in [0,1)", e.StepJitter)
	}
	if e.StepModel != StepModelLoad && e.StepModel != StepModelLinear {
		bad("step-model is %q, want %q or %q", e.StepModel, StepModelLoad, StepModelLinear)
	}
	if e.OutputLength != OutputMax && e.OutputLength != OutputUniform {
		bad("output-length is %q, want %q or %q", e.OutputLength, OutputMax, OutputUniform)
	}
	f := c.Front
	if !validLabelValue(f.Pool) {
		bad("pool is %q, want a non-empty printable name", f.Pool)
	}
	switch f.Mode {
	case ModePassthrough, ModeLegacyAdmission, ModeFlowControl:
	default:
		bad("mode is %q, want %s, %s or %s", f.Mode, ModePassthrough, ModeLegacyAdmission, ModeFlowControl)
	}
	if f.Detector != DetectorUtilization && f.Detector != DetectorConcurrency {
		bad("detector is %q, want %q or %q", f.Detector, DetectorUtilization, DetectorConcurrency)
	}
	if !(f.QueueDepthThreshold > 0) || math.IsInf(f.QueueDepthThreshold, 0) {
		bad("queue-depth-threshold is %v, want > 0", f.QueueDepthThreshold)
	}
	if !(f.KVCacheUtilThreshold > 0 && f.KVCacheUtilThreshold <= 1) {
		bad("kv-cache-util-threshold is %v, want a fraction in (0,1]", f.KVCacheUtilThreshold)
	}
	positive("max-concurrency", f.MaxConcurrency)
	if f.StalenessThreshold < 0 || f.RefreshInterval < 0 || f.FlushInterval < 0 || f.RequestTTL < 0 || f.RetryAfter < 0 {
		bad("staleness-threshold, refresh-interval, flush-interval, request-ttl and retry-after must be >= 0")
	}
	if f.RefreshInterval > 0 && f.StalenessThreshold > 0 && f.RefreshInterval >= f.StalenessThreshold {
		bad("refresh-interval %v must be shorter than staleness-threshold %v, or every pod reads stale", f.RefreshInterval, f.StalenessThreshold)
	}
	if f.CeilingPolicy != CeilingStatic && f.CeilingPolicy != CeilingPriorityHoldback {
		bad("ceiling-policy is %q, want %q or %q", f.CeilingPolicy, CeilingStatic, CeilingPriorityHoldback)
	}
	if !(f.Ceiling > 0) || math.IsInf(f.Ceiling, 0) {
		bad("ceiling is %v, want > 0", f.Ceiling)
	}
	if !(f.HoldbackMin > 0 && f.HoldbackMin <= f.Ceiling) {
		bad("holdback-min is %v, want in (0, ceiling=%v]", f.HoldbackMin, f.Ceiling)
	}
	positive("band-capacity", f.BandCapacity)
	for name, o := range f.Objectives {
		if name == "" || !validLabelValue(name) {
			bad("objective name %q is not a printable name", name)
		}
		if o.Class >= numClasses {
			bad("objective %q has class %d, want interactive or batch", name, o.Class)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("poolsim config: %w", errors.Join(errs...))
}

func validLabelValue(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// RegisterFlags registers the flags of `sluice simulate-pool` on fs, bound
// to c. Values already in c are the flags' defaults (call SetDefaults first
// to show the real defaults in the help).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	e, f := &c.Engine, &c.Front
	fs.IntVar(&c.Pods, "pods", c.Pods, "number of engine pods")
	fs.StringVar(&c.ModelName, "model", c.ModelName, "model_name label of the vLLM series, and the model of answers whose request names none")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "seed of step jitter, output lengths and routing ties (0: random)")
	fs.IntVar(&e.MaxNumSeqs, "max-num-seqs", e.MaxNumSeqs, "seats per pod: requests running at once")
	fs.IntVar(&e.MaxNumBatchedTokens, "max-num-batched-tokens", e.MaxNumBatchedTokens, "token budget of one engine step")
	fs.IntVar(&e.LongPrefillThreshold, "long-prefill-token-threshold", e.LongPrefillThreshold, "tokens one request may get in a step (0: no cap)")
	fs.BoolVar(&e.DisableChunkedPrefill, "disable-chunked-prefill", e.DisableChunkedPrefill, "a prompt that does not fit in the step's budget waits (and blocks the queue) instead of being chunked")
	fs.IntVar(&e.BlockSize, "block-size", e.BlockSize, "KV block size in tokens")
	fs.IntVar(&e.KVTokens, "kv-tokens", e.KVTokens, "KV capacity of one pod in tokens (rounded down to whole blocks)")
	fs.IntVar(&e.KVBlocks, "kv-blocks", e.KVBlocks, "KV capacity of one pod in blocks (vLLM's num_gpu_blocks); when set, replaces kv-tokens")
	fs.IntVar(&e.MaxModelLen, "max-model-len", e.MaxModelLen, "largest prompt + max_tokens; longer requests get 400")
	fs.StringVar(&e.Policy, "scheduling-policy", e.Policy, "waiting queue order: fcfs or priority (lower priority value first, then arrival)")
	fs.BoolVar(&e.PrefixCaching, "enable-prefix-caching", e.PrefixCaching, "cache the KV blocks of finished, aborted and preempted requests for later requests whose text prompt starts with theirs (vLLM's automatic prefix caching)")
	fs.BoolVar(&e.PreemptKeep, "preempt-keep", e.PreemptKeep, "a preempted request keeps its computed tokens (free swap; an idealised upper bound, not vLLM)")
	fs.BoolVar(&e.SeatPreempt, "seat-preempt", e.SeatPreempt, "priority policy: a waiting request of strictly higher priority preempts the lowest-priority running one when every seat is taken (vLLM PRs #45561/#54530; not in vLLM V1)")
	fs.StringVar(&e.StepModel, "step-model", e.StepModel, "step time: load (ITL0 scaled by the load factor, plus c_p per prompt token and o_p per starting prefill) or linear (BLIS: ITL0 + c_p per uncached prompt token + c_d per decode token)")
	fs.DurationVar(&e.ITL, "itl", e.ITL, "ITL0: step time with one sequence and no prefill (linear: the constant of every step)")
	fs.Float64Var(&e.LoadFactor, "time-factor-under-load", e.LoadFactor, "F: decode step time factor at max-num-seqs sequences (>= 1)")
	fs.DurationVar(&e.PrefillPerToken, "prefill-time-per-token", e.PrefillPerToken, "c_p: step time added per prompt token computed in the step")
	fs.DurationVar(&e.PrefillOverhead, "prefill-overhead", e.PrefillOverhead, "o_p: step time added per request whose prefill starts in the step")
	fs.DurationVar(&e.DecodePerToken, "decode-time-per-token", e.DecodePerToken, "c_d: step time added per decode token in the step (BLIS's beta2)")
	fs.DurationVar(&e.RequestOverhead, "request-overhead", e.RequestOverhead, "CPU time a request spends outside the step loop before it reaches the pod's queue (BLIS's alpha0)")
	fs.Float64Var(&e.StepJitter, "step-jitter", e.StepJitter, "spread of each step's duration, a fraction in [0,1) (uniform ±)")
	fs.IntVar(&e.DefaultMaxTokens, "default-max-tokens", e.DefaultMaxTokens, "max_tokens of a request whose body has none")
	fs.StringVar(&e.OutputLength, "output-length", e.OutputLength, "max: generate max_tokens tokens; uniform: a seeded draw in [1, max_tokens]")
	fs.IntVar(&e.InteractivePriority, "interactive-priority", e.InteractivePriority, "engine priority of interactive requests without a body priority (priority policy only)")
	fs.BoolVar(&e.IgnoreHangups, "ignore-hangups", e.IgnoreHangups, "run a request whose client went away to its end (not counted as an abort), as a server that does not watch its connections")
	fs.IntVar(&e.BatchPriority, "batch-priority", e.BatchPriority, "engine priority of batch requests without a body priority (priority policy only; 0 means the default)")
	fs.StringVar(&f.Pool, "pool", f.Pool, "inference pool name in the EPP series")
	fs.StringVar(&f.Mode, "mode", f.Mode, "front mode: passthrough, legacy-admission or flow-control")
	fs.BoolVar(&f.PrefixAware, "prefix-aware-routing", f.PrefixAware, "route a request whose text prompt shares four KV blocks with one routed to a pod lately to that pod (the EPP's approximate prefix-cache scorer; needs --enable-prefix-caching)")
	fs.StringVar(&f.Detector, "detector", f.Detector, "saturation detector: utilization or concurrency")
	fs.Float64Var(&f.QueueDepthThreshold, "queue-depth-threshold", f.QueueDepthThreshold, "utilization detector: waiting requests that score a pod 1.0")
	fs.Float64Var(&f.KVCacheUtilThreshold, "kv-cache-util-threshold", f.KVCacheUtilThreshold, "utilization detector: KV usage that scores a pod 1.0")
	fs.DurationVar(&f.StalenessThreshold, "staleness-threshold", f.StalenessThreshold, "age past which a pod's metrics score 1.0")
	fs.IntVar(&f.MaxConcurrency, "max-concurrency", f.MaxConcurrency, "concurrency detector: requests per pod that read as saturation 1.0")
	fs.DurationVar(&f.RefreshInterval, "refresh-interval", f.RefreshInterval, "how often the front reads the pods' gauges")
	fs.DurationVar(&f.FlushInterval, "flush-interval", f.FlushInterval, "how often the inference_pool_* averages are written")
	fs.Var(objectiveFlag{f}, "objective", "objective `name=priority[:class]` (repeatable; class interactive or batch); the first use replaces the default map")
	fs.DurationVar(&f.RetryAfter, "retry-after", f.RetryAfter, "Retry-After of rejected-saturated 429s (0: none, as the EPP)")
	fs.StringVar(&f.CeilingPolicy, "ceiling-policy", f.CeilingPolicy, "flow control ceiling per band: static or priority-holdback")
	fs.Float64Var(&f.Ceiling, "ceiling", f.Ceiling, "flow control: saturation at which dispatch stops (highest band's ceiling with priority-holdback)")
	fs.Float64Var(&f.HoldbackMin, "holdback-min", f.HoldbackMin, "priority-holdback: ceiling of the lowest band")
	fs.IntVar(&f.BandCapacity, "band-capacity", f.BandCapacity, "flow control: requests one band holds (more get 429)")
	fs.DurationVar(&f.RequestTTL, "request-ttl", f.RequestTTL, "flow control: longest wait in a band before 503 rejected-ttl-expired")
}

// objectiveFlag parses --objective name=priority[:class].
type objectiveFlag struct{ f *FrontConfig }

func (o objectiveFlag) String() string {
	if o.f == nil || len(o.f.Objectives) == 0 {
		return ""
	}
	names := make([]string, 0, len(o.f.Objectives))
	for n := range o.f.Objectives {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + strconv.Itoa(o.f.Objectives[n].Priority) + ":" + o.f.Objectives[n].Class.String()
	}
	return strings.Join(parts, ",")
}

func (o objectiveFlag) Set(s string) error {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("objective %q: want name=priority[:class]", s)
	}
	prio, class, hasClass := strings.Cut(rest, ":")
	p, err := strconv.Atoi(prio)
	if err != nil {
		return fmt.Errorf("objective %q: priority %q is not an integer", s, prio)
	}
	obj := Objective{Priority: p, Class: guessClass(name)}
	if hasClass {
		if obj.Class, err = ParseClass(class); err != nil {
			return fmt.Errorf("objective %q: %w", s, err)
		}
	}
	if !o.f.objectivesFromFlag {
		o.f.Objectives = map[string]Objective{}
		o.f.objectivesFromFlag = true
	}
	o.f.Objectives[name] = obj
	return nil
}
