// Package headroom is the gate of type "pool-headroom": it keeps seats of
// an inference pool free for the traffic that does not come through sluice
// (interactive requests sent to the pool directly), reading each model
// server's own gauges often, without a Prometheus server in between.
//
//	{"gate_type":"pool-headroom","evict":true,"gate_params":{
//	  "endpoints":["http://vllm-0:8000/metrics","http://vllm-1:8000/metrics"],
//	  "seats_per_pod":16,"reserve":4,"reserve_share":0.25}}
//
// One reading: GET every endpoint (in parallel, each bounded by the
// refresh's context and a 2 s timeout), sum running_metric and
// waiting_metric (vLLM's vllm:num_requests_running and
// vllm:num_requests_waiting by default; series filtered by labels, summed
// when several match) over the pods, then
//
//	seats   = pods × seats_per_pod      (a pod's --max-num-seqs)
//	own     = requests this gate admitted and not yet released
//	others  = max(0, running + waiting − own)   (the traffic sluice does not send)
//	held    = the highest others of the readings within hold (default 1s)
//	keep    = reserve + ceil(reserve_share × held)
//	allowed = seats − keep − held
//	budget  = clamp(allowed / max_concurrency, 0, 1)
//
// so the queue's in-flight limit, ceil(max_concurrency × budget), is the
// seats the other traffic leaves minus the reserve. The reserve is what
// absorbs the other traffic's arrivals between two readings (the default
// refresh is 50 ms); reserve_share grows it with that traffic, so a burst
// that is growing finds room. A falling limit stops new claims at once;
// with the queue's "evict": true it also takes back the youngest requests
// in flight over it (core/pipeline's evictor), which is what frees seats
// within a step instead of after a batch generation.
//
// With burst_threshold (off by default) the gate also watches for bursts
// of the other traffic (see Burst): a reading whose others reach the
// threshold starts one, and it lasts burst_window (default 2s) past the
// last such reading. In a burst the reserve is reserve; outside one it is
// idle_reserve (default: reserve), so the batch may fill the pool between
// bursts and give seats back the moment one starts. In a burst the limit
// also rises above what the queue has in flight by at most one request per
// burst_growth (default: the refresh interval), since every batch request
// that starts is a prefill lengthening the steps interactive first tokens
// wait for:
//
//	keep    = (burst ? reserve : idle_reserve) + ceil(reserve_share × held)
//	allowed = seats − keep − held, and in a burst at most own + 1
//
// With kv_limit (off by default) it also reads kv_metric (vLLM's
// vllm:kv_cache_usage_perc) per pod: while the fullest pod's KV cache is
// above kv_limit, the limit holds at own, so nothing more is admitted and
// nothing is taken back for it. A long batch generation's context grows
// with every token, so seats alone let the batch fill the cache, and an
// interactive request then waits for blocks however many seats are free.
// (Lowering the limit below own, which takes calls back, was tried: the
// take-backs in idle phases used up the requests' evict_limit, and in the
// bursts the batch could no longer be taken back.)
//
// Several sluice replicas on one pool share an account with
// account_redis (see account.go): each publishes what it has in flight
// and counts the other replicas' calls as the batch's, not as other
// traffic, and the rule's limit is split between them.
//
// A failed reading (an endpoint down, a metric missing) keeps the last
// budget (failure policy keep-last; an eviction happens only on a reading
// that worked). The gate is an Admitter only to count what it admitted;
// it admits every request the credits let through.
package headroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/internal/exposition"
)

// Type is the gate's registry name.
const Type = "pool-headroom"

// Defaults of the parameters.
const (
	DefaultReserve       = 2
	DefaultRunningMetric = "vllm:num_requests_running"
	DefaultWaitingMetric = "vllm:num_requests_waiting"
	DefaultKVMetric      = "vllm:kv_cache_usage_perc"
	// DefaultStepMetric is vLLM's histogram of tokens per engine step:
	// its sample count is the pod's steps.
	DefaultStepMetric      = "vllm:iteration_tokens_total"
	DefaultRefreshInterval = 50 * time.Millisecond
	DefaultHold            = time.Second
	DefaultBurstWindow     = 2 * time.Second
	// ScrapeTimeout bounds one endpoint's GET.
	ScrapeTimeout = 2 * time.Second
)

// maxBody bounds a scraped page.
const maxBody = 16 << 20

// Config configures a Gate.
type Config struct {
	// Endpoints are the pods' metrics URLs, one per pod (required).
	Endpoints []string
	// SeatsPerPod is each pod's seat count: vLLM's --max-num-seqs (required).
	SeatsPerPod int
	// Reserve is how many seats, pool-wide, are kept free (default 2; 0
	// keeps none beyond reserve_share).
	Reserve *int
	// ReserveShare keeps another ceil(ReserveShare × others) seats free, in
	// [0,1) (default 0).
	ReserveShare float64
	// WaitingWeight multiplies the waiting gauge in others (default 1). A
	// request waiting for a seat waits on one pod, and sluice cannot tell
	// on which pod the calls it would take back run: a weight of the pod
	// count takes back enough that one lands on each pod.
	WaitingWeight float64
	// Hold is how long a peak of the other traffic is remembered (default
	// 1s; negative: not at all): the limit follows the highest others of
	// the last Hold, so it falls at once when that traffic grows and
	// rises only once it stayed lower for Hold. Without it the limit
	// follows every arrival and completion of a burst, and each fall and
	// rise is a batch request aborted and another started: prefill work
	// that lengthens the pool's steps for everyone.
	Hold time.Duration
	// RunningMetric and WaitingMetric are the gauges read per pod.
	RunningMetric, WaitingMetric string
	// BurstThreshold is the others of one reading that start or extend a
	// burst (default 0: no burst rule; see Burst).
	BurstThreshold int
	// BurstWindow is how long a burst lasts after the last reading at or
	// over BurstThreshold (default 2s).
	BurstWindow time.Duration
	// BurstGrowth is, in a burst, the shortest time between two rises of
	// the limit, by one request each (default: RefreshInterval).
	BurstGrowth time.Duration
	// IdleReserve is the reserve outside a burst, with BurstThreshold
	// (default: Reserve).
	IdleReserve *int
	// KVLimit is the KV-cache usage (0..1] of the fullest pod above which
	// the limit holds at what the queue has in flight (default 0: KV not
	// read).
	KVLimit float64
	// KVMetric is the KV-cache usage gauge read per pod with KVLimit
	// (default vllm:kv_cache_usage_perc).
	KVMetric string
	// Labels filter the series read ("" also matches a series without the label).
	Labels map[string]string
	// MaxConcurrency is the queue's in-flight limit at budget 1 (gate.Env's).
	MaxConcurrency int
	// RefreshInterval is how often the budget is read (default 50ms).
	RefreshInterval time.Duration
	// EvictCheck is how the gate checks that the calls the pipeline takes
	// back (the queue's evict) leave the pool: EvictCheckAuto (default),
	// EvictCheckStrict or EvictCheckOff (see evictCheck).
	EvictCheck string
	// EvictCheckReadings is how many readings after calls were taken back
	// the pods' abort counter may take to show them (default 10).
	EvictCheckReadings int
	// EvictCheckBackoff is how long eviction stays suspended after a check
	// failed (default 30s); it doubles with each retry that fails again,
	// up to 8×.
	EvictCheckBackoff time.Duration
	// AbortMetric is the counter of aborted requests read per pod (default
	// vllm:request_success_total), its series filtered by AbortLabels
	// (default finished_reason="abort") and Labels, summed.
	AbortMetric string
	AbortLabels map[string]string
	// Logger receives the eviction check's lines (default slog.Default()).
	Logger *slog.Logger
	// Dispatch is where the queue's batch goes: DispatchGateway (default:
	// the queue's gateway; the gate's rules apply to the pool as a whole)
	// or DispatchPods (straight to the pod the gate places each request
	// on; every rule applies per pod: see pods.go).
	Dispatch string
	// PodURLs are, with DispatchPods, the pods' inference base URLs, one
	// per endpoint in the same order (default: each endpoint without its
	// trailing /metrics).
	PodURLs []string
	// PendingPrefills is, with DispatchPods, how many calls may be placed
	// on one pod between two readings of it (default 1): each is a
	// prefill its next steps carry.
	PendingPrefills int
	// PaceTokens is, with DispatchPods, the pace of the batch's prefill on
	// each pod in prompt tokens per second (default 0: no pace in tokens):
	// after placing a request that brings P uncached prompt tokens to a
	// pod, the gate places the next one there P ÷ PaceTokens seconds
	// later at the earliest (see pods.go).
	PaceTokens float64
	// StepMetric is, with DispatchPods, the histogram whose sample count
	// is a pod's engine steps (default vllm:iteration_tokens_total;
	// "none": not read). From it the gate learns each pod's mean step, and
	// counts as its own waiting requests only its placements of the last
	// one and a quarter steps before a reading (see PodReading.Queued); without it, all
	// its placements since the previous reading.
	StepMetric string
	// BurstPaceTokens is, with PaceTokens, the pace on a pod while that
	// pod's other traffic is in a burst (its others reaching
	// BurstThreshold); 0 (default): PaceTokens then too.
	BurstPaceTokens float64
	// BytesPerToken converts a request's payload size into the prompt
	// tokens PaceTokens counts (default 4, the usual bytes of English
	// text per token).
	BytesPerToken float64
	// ReleaseGrace is how long a released request still counts as the
	// queue's own (default two refresh intervals). A request sluice
	// aborted (evicted, cancelled) is released at once but leaves the
	// pod's gauges only at the pod's next step: counted as "others" in
	// between, it would shrink the limit and evict again.
	ReleaseGrace time.Duration
	// Account is shared with the other replicas gating the same pool, so
	// that each counts their calls as the batch's, not as other traffic
	// (default: none; see account.go).
	Account AccountConfig
}

// SetDefaults fills the zero fields.
func (c *Config) SetDefaults() {
	if c.Reserve == nil {
		r := DefaultReserve
		c.Reserve = &r
	}
	if c.RunningMetric == "" {
		c.RunningMetric = DefaultRunningMetric
	}
	if c.WaitingMetric == "" {
		c.WaitingMetric = DefaultWaitingMetric
	}
	if c.KVMetric == "" {
		c.KVMetric = DefaultKVMetric
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = 1
	}
	if c.Hold == 0 {
		c.Hold = DefaultHold
	}
	if c.WaitingWeight == 0 {
		c.WaitingWeight = 1
	}
	if c.ReleaseGrace <= 0 {
		c.ReleaseGrace = 2 * c.RefreshInterval
	}
	if c.BurstWindow == 0 {
		c.BurstWindow = DefaultBurstWindow
	}
	if c.BurstGrowth == 0 {
		c.BurstGrowth = c.RefreshInterval
	}
	if c.IdleReserve == nil {
		c.IdleReserve = c.Reserve
	}
	if c.EvictCheck == "" {
		c.EvictCheck = EvictCheckAuto
	}
	if c.EvictCheckReadings == 0 {
		c.EvictCheckReadings = DefaultEvictCheckReadings
	}
	if c.EvictCheckBackoff == 0 {
		c.EvictCheckBackoff = DefaultEvictCheckBackoff
	}
	if c.AbortMetric == "" {
		c.AbortMetric = DefaultAbortMetric
	}
	if c.StepMetric == "" {
		c.StepMetric = DefaultStepMetric
	}
	if c.AbortLabels == nil {
		c.AbortLabels = maps.Clone(DefaultAbortLabels)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Dispatch == "" {
		c.Dispatch = DispatchGateway
	}
	if c.PendingPrefills == 0 {
		c.PendingPrefills = DefaultPendingPrefills
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = DefaultBytesPerToken
	}
	c.Account.setDefaults(c.Endpoints, c.RefreshInterval)
}

// Validate reports every unusable parameter.
func (c Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("gate_params.endpoints is required: the metrics URL of every pod of the pool"))
	}
	for _, e := range c.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("gate_params.endpoints: %q is not an http(s)://host[:port]/path URL", e))
		}
	}
	if c.SeatsPerPod <= 0 {
		errs = append(errs, fmt.Errorf("gate_params.seats_per_pod: %d, want > 0 (the pods' --max-num-seqs)", c.SeatsPerPod))
	}
	if c.Reserve != nil && *c.Reserve < 0 {
		errs = append(errs, fmt.Errorf("gate_params.reserve: %d is negative", *c.Reserve))
	}
	if !(c.WaitingWeight >= 0) || math.IsInf(c.WaitingWeight, 0) {
		errs = append(errs, fmt.Errorf("gate_params.waiting_weight: %v, want a finite number ≥ 0", c.WaitingWeight))
	}
	if c.BurstThreshold < 0 {
		errs = append(errs, fmt.Errorf("gate_params.burst_threshold: %d is negative (0: no burst rule)", c.BurstThreshold))
	}
	if c.BurstWindow < 0 {
		errs = append(errs, fmt.Errorf("gate_params.burst_window: %v is negative", c.BurstWindow))
	}
	if c.BurstGrowth < 0 {
		errs = append(errs, fmt.Errorf("gate_params.burst_growth: %v is negative", c.BurstGrowth))
	}
	if c.IdleReserve != nil && *c.IdleReserve < 0 {
		errs = append(errs, fmt.Errorf("gate_params.idle_reserve: %d is negative", *c.IdleReserve))
	}
	if !(c.KVLimit >= 0 && c.KVLimit <= 1) {
		errs = append(errs, fmt.Errorf("gate_params.kv_limit: %v outside [0,1] (0: KV not read)", c.KVLimit))
	}
	switch c.EvictCheck {
	case EvictCheckAuto, EvictCheckStrict, EvictCheckOff:
	default:
		errs = append(errs, fmt.Errorf("gate_params.evict_check: %q, want auto, strict or off", c.EvictCheck))
	}
	if c.EvictCheckReadings < 0 {
		errs = append(errs, errors.New("gate_params.evict_check_readings: want ≥ 1"))
	}
	if c.EvictCheckBackoff < 0 {
		errs = append(errs, errors.New("gate_params.evict_check_backoff: want a duration > 0"))
	}
	if !(c.ReserveShare >= 0 && c.ReserveShare < 1) {
		errs = append(errs, fmt.Errorf("gate_params.reserve_share: %v outside [0,1)", c.ReserveShare))
	}
	switch c.Dispatch {
	case DispatchGateway:
		if len(c.PodURLs) > 0 {
			errs = append(errs, fmt.Errorf("gate_params.pod_urls: set with dispatch %q; it is used only with dispatch %q", c.Dispatch, DispatchPods))
		}
	case DispatchPods:
		if _, err := podURLs(c.Endpoints, c.PodURLs); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("gate_params.dispatch: %q, want %q or %q", c.Dispatch, DispatchGateway, DispatchPods))
	}
	if c.PendingPrefills < 0 {
		errs = append(errs, fmt.Errorf("gate_params.pending_prefills: %d, want ≥ 1", c.PendingPrefills))
	}
	switch {
	case c.PaceTokens < 0 || math.IsNaN(c.PaceTokens) || math.IsInf(c.PaceTokens, 0):
		errs = append(errs, fmt.Errorf("gate_params.pace_tokens: %v, want prompt tokens per second per pod ≥ 0 (0: no pace in tokens)", c.PaceTokens))
	case c.PaceTokens > 0 && c.Dispatch != DispatchPods:
		errs = append(errs, fmt.Errorf("gate_params.pace_tokens: %v needs dispatch %q (the gate paces the pods it places requests on)", c.PaceTokens, DispatchPods))
	}
	switch {
	case c.BurstPaceTokens < 0 || math.IsNaN(c.BurstPaceTokens) || math.IsInf(c.BurstPaceTokens, 0):
		errs = append(errs, fmt.Errorf("gate_params.burst_pace_tokens: %v, want prompt tokens per second per pod ≥ 0 (0: pace_tokens in bursts too)", c.BurstPaceTokens))
	case c.BurstPaceTokens > 0 && !(c.PaceTokens > 0):
		errs = append(errs, fmt.Errorf("gate_params.burst_pace_tokens: %v needs pace_tokens (the pace outside bursts)", c.BurstPaceTokens))
	case c.BurstPaceTokens > 0 && c.BurstThreshold <= 0:
		errs = append(errs, fmt.Errorf("gate_params.burst_pace_tokens: %v needs burst_threshold > 0 (what tells a burst)", c.BurstPaceTokens))
	}
	if !(c.BytesPerToken > 0) || math.IsInf(c.BytesPerToken, 0) {
		errs = append(errs, fmt.Errorf("gate_params.bytes_per_token: %v, want > 0", c.BytesPerToken))
	}
	errs = append(errs, c.Account.validate(c.RefreshInterval)...)
	return errors.Join(errs...)
}

// Gate is the pool-headroom gate. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	client *http.Client
	tr     *http.Transport
	now    func() time.Time

	mu    sync.Mutex
	own   ledger   // admitted (dispatch "gateway")
	peaks PeakHold // others seen within Hold (dispatch "gateway")
	rule  Rule
	pods  []*podState // dispatch "pods": one per endpoint
	// waiting are the requests waiting for a pod (dispatch "pods")
	waiting waiters
	last    Reading
	check   *evictCheck // nil with EvictCheckOff
	share   *sharing    // nil without an account
	// ruled is the last reading's limit before bounded (dispatch
	// "gateway" with an account): the room the next exchange publishes
	// is what it leaves.
	ruled int
}

// Reading is what the last successful reading saw.
type Reading struct {
	At                    time.Time
	Running, Waiting, Own int
	// Peers are the other replicas' calls (with an account), Replicas
	// the live replicas this one included.
	Peers, Replicas int
	// Others is the traffic sluice does not send; Held its peak within Hold.
	Others, Held         int
	Keep, Allowed, Seats int
	// Burst is set when the reading fell in a burst (with BurstThreshold).
	Burst bool
	// KV is the fullest pod's KV-cache usage (with KVLimit), KVCap the
	// limit it held the queue at (-1: none).
	KV     float64
	KVCap  int
	Budget float64
	// Pods is each pod's part, with dispatch "pods" (the fields above
	// are then their sums; Burst: any pod's).
	Pods []PodReading
}

var (
	_ gate.Gate           = (*Gate)(nil)
	_ gate.Admitter       = (*Gate)(nil)
	_ gate.Describer      = (*Gate)(nil)
	_ gate.Intervaler     = (*Gate)(nil)
	_ gate.PolicyReporter = (*Gate)(nil)

	_ gate.EvictionChecker = (*Gate)(nil)
)

// New returns the gate; it does no I/O.
func New(cfg Config) (*Gate, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, tr := exposition.NewClient(time.Second, ScrapeTimeout)
	g := &Gate{cfg: cfg, tr: tr, client: client, now: time.Now,
		rule: Rule{Seats: len(cfg.Endpoints) * cfg.SeatsPerPod, Reserve: *cfg.Reserve, IdleReserve: *cfg.IdleReserve,
			ReserveShare: cfg.ReserveShare,
			Burst:        Burst{Threshold: cfg.BurstThreshold, Window: cfg.BurstWindow, Growth: cfg.BurstGrowth}}}
	if cfg.EvictCheck != EvictCheckOff {
		g.check = newEvictCheck(cfg)
	}
	if cfg.Dispatch == DispatchPods {
		var err error
		if g.pods, err = newPods(cfg); err != nil {
			return nil, err
		}
	}
	var err error
	if g.share, err = newSharing(cfg); err != nil {
		return nil, err
	}
	return g, nil
}

// given reads key with get when it is set. A value of 0 written out is
// returned as -1, so that Validate refuses it rather than SetDefaults
// replacing it; absent, it is 0 (the default applies).
func given[T int | float64](p gate.Params, key string, get func(string, T) (T, error)) (T, error) {
	if !p.Has(key) {
		return 0, nil
	}
	v, err := get(key, 0)
	if err == nil && v == 0 {
		v = -1
	}
	return v, err
}

// Factory builds the gate from gate_params: endpoints (a JSON array or a
// comma-separated string), seats_per_pod, reserve, reserve_share,
// waiting_weight, hold, burst_threshold, burst_window, burst_growth,
// idle_reserve, kv_limit, kv_metric, running_metric, waiting_metric,
// labels, evict_check, evict_check_readings, evict_check_backoff,
// abort_metric, abort_labels, dispatch, pod_urls, pending_prefills, pace_tokens, burst_pace_tokens, bytes_per_token, step_metric, and the generic refresh_interval (which also paces its own
// readings); the queue's concurrency is max_concurrency. Replicas on one
// pool share an account (see account.go) with account_redis (host:port, a
// redis:// or rediss:// URL, or "deployment": the deployment's Redis;
// unset: no account), account_key (default: derived from the endpoints),
// replica (this replica's id, default hostname-pid) and account_ttl
// (default 10 refresh intervals, at least 1s).
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	eps, err := urlList(p, "endpoints")
	if err != nil {
		return nil, err
	}
	cfg := Config{Endpoints: eps, MaxConcurrency: env.MaxConcurrency, Logger: env.Logger,
		RunningMetric: p.String("running_metric", ""), WaitingMetric: p.String("waiting_metric", ""),
		EvictCheck: p.String("evict_check", ""), AbortMetric: p.String("abort_metric", ""), StepMetric: p.String("step_metric", ""),
		Dispatch: p.String("dispatch", "")}
	if cfg.PodURLs, err = urlList(p, "pod_urls"); err != nil {
		return nil, err
	}
	if cfg.Account, err = accountParams(p, env); err != nil {
		return nil, err
	}
	if cfg.PaceTokens, err = p.Float("pace_tokens", 0); err != nil {
		return nil, err
	}
	if cfg.BurstPaceTokens, err = p.Float("burst_pace_tokens", 0); err != nil {
		return nil, err
	}
	if cfg.BytesPerToken, err = given(p, "bytes_per_token", p.Float); err != nil {
		return nil, err
	}
	if cfg.PendingPrefills, err = given(p, "pending_prefills", p.Int); err != nil {
		return nil, err
	}
	// the generic refresh_interval also sets the gate's own clock (its
	// release grace and burst growth default to it)
	if cfg.RefreshInterval, err = p.Duration(gate.ParamRefreshInterval, 0); err != nil {
		return nil, err
	}
	if cfg.SeatsPerPod, err = p.Int("seats_per_pod", 0); err != nil {
		return nil, err
	}
	if p.Has("reserve") {
		r, err := p.Int("reserve", DefaultReserve)
		if err != nil {
			return nil, err
		}
		cfg.Reserve = &r
	}
	if cfg.ReserveShare, err = p.Float("reserve_share", 0); err != nil {
		return nil, err
	}
	if cfg.WaitingWeight, err = p.Float("waiting_weight", 1); err != nil {
		return nil, err
	}
	if cfg.Hold, err = p.Duration("hold", DefaultHold); err != nil {
		return nil, err
	}
	if cfg.BurstThreshold, err = p.Int("burst_threshold", 0); err != nil {
		return nil, err
	}
	if cfg.BurstWindow, err = p.Duration("burst_window", DefaultBurstWindow); err != nil {
		return nil, err
	}
	if cfg.BurstGrowth, err = p.Duration("burst_growth", 0); err != nil {
		return nil, err
	}
	if p.Has("idle_reserve") {
		r, err := p.Int("idle_reserve", 0)
		if err != nil {
			return nil, err
		}
		cfg.IdleReserve = &r
	}
	if cfg.KVLimit, err = p.Float("kv_limit", 0); err != nil {
		return nil, err
	}
	cfg.KVMetric = p.String("kv_metric", "")
	if cfg.Labels, err = p.StringMap("labels"); err != nil {
		return nil, err
	}
	if cfg.EvictCheckReadings, err = given(p, "evict_check_readings", p.Int); err != nil {
		return nil, err
	}
	if cfg.EvictCheckBackoff, err = p.Duration("evict_check_backoff", DefaultEvictCheckBackoff); err != nil {
		return nil, err
	}
	if cfg.EvictCheckBackoff == 0 {
		cfg.EvictCheckBackoff = -1 // refused by Validate, not defaulted
	}
	if p.Has("abort_labels") {
		if cfg.AbortLabels, err = p.StringMap("abort_labels"); err != nil {
			return nil, err
		}
		if cfg.AbortLabels == nil {
			cfg.AbortLabels = map[string]string{}
		}
	}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	g, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// urlList reads gate_params.<key>: a JSON array of strings, or one
// string of comma-separated URLs.
func urlList(p gate.Params, key string) ([]string, error) {
	raw := p.Raw(key)
	if len(raw) > 0 && raw[0] == '[' {
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("gate_params.%s: %w", key, err)
		}
		return list, nil
	}
	var out []string
	for _, e := range strings.Split(p.String(key, ""), ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out, nil
}

// Budget reads every pod and returns the share of the queue's concurrency
// the other traffic leaves beyond the reserve (with dispatch "pods", the
// sum of every pod's limit: see podState).
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	peersOf := g.exchange(ctx)
	rd, err := g.read(ctx)
	peers, bound := peersOf()
	if err != nil {
		return 0, err
	}
	c := g.cfg
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	r := Reading{At: now, Running: rd.running, Waiting: rd.waiting, Seats: len(c.Endpoints) * c.SeatsPerPod, KV: rd.kv, KVCap: -1,
		Replicas: peers.Replicas + 1}
	if g.pods != nil {
		g.readPods(&r, rd, peers)
	} else {
		// the batch is every replica's: own and peers (see account.go)
		r.Own, r.Peers = g.own.at(now, c.ReleaseGrace), at(peers.InFlight, 0)
		r.Others = g.share.confirmed(0, g.others(rd.running, rd.waiting, r.Own+r.Peers), peers)
		r.Held = g.peaks.Held(now, c.Hold, r.Others)
		if c.KVLimit > 0 && rd.kv > c.KVLimit {
			r.KVCap = r.Own + r.Peers
		}
		r.Burst, r.Keep, r.Allowed = g.rule.Apply(now, r.Others, r.Held, r.Own+r.Peers, r.KVCap)
		r.Allowed = g.bounded(share(r.Allowed, r.Own, peers, 0), bound, peers)
	}
	r.Budget = min(1, float64(r.Allowed)/float64(c.MaxConcurrency))
	g.last = r
	if g.check != nil {
		g.check.observe(now, rd.aborts, rd.abortsOK, rd.running+rd.waiting)
	}
	return r.Budget, nil
}

// others is the traffic sluice does not send, of running and waiting
// requests of which own are the queue's.
func (g *Gate) others(running, waiting, own int) int {
	return max(0, running+int(math.Ceil(g.cfg.WaitingWeight*float64(waiting)))-own)
}

// reading is what one reading of every pod found.
type reading struct {
	start            time.Time // when the scrape began
	running, waiting int
	kv               float64 // the fullest pod's, with KVLimit
	// pods are each pod's gauges, in the endpoints' order.
	pods []podGauges
	// aborts is each pod's abort counter, abortsOK whether the pod
	// exports it (read only with the eviction check).
	aborts   []float64
	abortsOK []bool
}

// read sums the running and waiting gauges over the pods and, with
// KVLimit, returns the highest KV-cache usage of any pod; with the
// eviction check, each pod's abort counter (absent: not an error).
func (g *Gate) read(ctx context.Context) (reading, error) {
	type page struct {
		run, wait, kv float64
		aborts        float64
		abortsOK      bool
		steps         float64
		stepsOK       bool
		err           error
	}
	start := g.now()
	steps := g.pods != nil && g.cfg.StepMetric != StepMetricNone
	var abortLabels map[string]string
	if g.check != nil {
		abortLabels = maps.Clone(g.cfg.Labels)
		if abortLabels == nil {
			abortLabels = map[string]string{}
		}
		maps.Copy(abortLabels, g.cfg.AbortLabels)
	}
	pages := make([]page, len(g.cfg.Endpoints))
	var wg sync.WaitGroup
	for i, u := range g.cfg.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fams, err := exposition.Scrape(ctx, g.client, u, maxBody)
			if err != nil {
				pages[i].err = err
				return
			}
			pages[i].run, pages[i].err = sum(fams[g.cfg.RunningMetric], g.cfg.Labels, u, g.cfg.RunningMetric)
			if pages[i].err == nil {
				pages[i].wait, pages[i].err = sum(fams[g.cfg.WaitingMetric], g.cfg.Labels, u, g.cfg.WaitingMetric)
			}
			if pages[i].err == nil && g.cfg.KVLimit > 0 {
				pages[i].kv, pages[i].err = sum(fams[g.cfg.KVMetric], g.cfg.Labels, u, g.cfg.KVMetric)
			}
			if pages[i].err == nil && abortLabels != nil {
				v, err := sum(fams[g.cfg.AbortMetric], abortLabels, u, g.cfg.AbortMetric)
				pages[i].aborts, pages[i].abortsOK = v, err == nil
			}
			if pages[i].err == nil && steps {
				pages[i].steps, pages[i].stepsOK = exposition.Count(fams[g.cfg.StepMetric], g.cfg.Labels)
			}
		}()
	}
	wg.Wait()
	var errs []error
	var run, wait float64
	rd := reading{start: start, aborts: make([]float64, len(pages)), abortsOK: make([]bool, len(pages)), pods: make([]podGauges, len(pages))}
	for i, p := range pages {
		errs = append(errs, p.err)
		run += p.run
		wait += p.wait
		rd.kv = max(rd.kv, p.kv)
		rd.pods[i] = podGauges{running: int(math.Round(p.run)), waiting: int(math.Round(p.wait)), kv: p.kv, steps: p.steps, stepsOK: p.stepsOK}
		rd.aborts[i], rd.abortsOK[i] = p.aborts, p.abortsOK
	}
	if err := errors.Join(errs...); err != nil {
		return reading{}, err
	}
	rd.running, rd.waiting = int(math.Round(run)), int(math.Round(wait))
	return rd, nil
}

// EvictionState implements gate.EvictionChecker: eviction is suspended
// for a back-off after the pods did not count the calls taken back, and
// pending while they have not shown the last ones yet (see evictCheck).
func (g *Gate) EvictionState(context.Context) gate.EvictionState {
	if g.check == nil {
		return gate.EvictionState{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var st gate.EvictionState
	st.Suspended, st.Pending, st.Until, st.Reason = g.check.state(g.now())
	return st
}

// Evicted implements gate.EvictionChecker: it opens a check of the n
// calls the pipeline just took back.
func (g *Gate) Evicted(_ context.Context, n int) {
	if g.check == nil {
		return
	}
	g.mu.Lock()
	g.check.evicted(g.now(), n)
	g.mu.Unlock()
}

// ErrNoSample means a page had no series of a metric matching the labels.
var ErrNoSample = errors.New("no sample")

// sum adds the matching series of one family; none is an error.
func sum(mf *dto.MetricFamily, labels map[string]string, u, metric string) (float64, error) {
	vs := exposition.Values(mf, labels)
	if len(vs) == 0 {
		return 0, fmt.Errorf("scrape %s: %s: %w", u, metric, ErrNoSample)
	}
	var t float64
	for _, v := range vs {
		t += v
	}
	if math.IsNaN(t) || math.IsInf(t, 0) {
		return 0, fmt.Errorf("scrape %s: %s is %v", u, metric, t)
	}
	return t, nil
}

// Admit counts the request as the queue's own until the grace after its
// Release. With dispatch "gateway" it admits every request; with "pods" it
// places the request on a pod with room (see place), or asks it to wait.
func (g *Gate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := &g.own
	dec := gate.Decision{Verdict: gate.Admit}
	if g.pods != nil {
		p, why, retry := g.place(req)
		switch {
		case p != nil:
		case g.handBack():
			g.waiting.done(waiterOf(req))
			return gate.Decision{Verdict: gate.Defer, Delay: time.Nanosecond, Reason: why + "; another replica has room"}, nil
		default:
			// it waits in flight (a request taken back waits for its
			// pod, which keeps its next place for it: back in the
			// queue, it could find every worker held by requests
			// waiting for any pod)
			return gate.Decision{Verdict: gate.Wait, Delay: retry, Reason: why}, nil
		}
		l, dec.Pod = &p.own, p.url
	}
	l.admit()
	var once sync.Once
	dec.Release = func() {
		once.Do(func() {
			g.mu.Lock()
			l.release(g.now())
			g.mu.Unlock()
		})
	}
	return dec, nil
}

// Last returns the last successful reading (zero before the first).
func (g *Gate) Last() Reading {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// RefreshInterval implements gate.Intervaler.
func (g *Gate) RefreshInterval() time.Duration { return g.cfg.RefreshInterval }

// FailurePolicy implements gate.PolicyReporter: a failed reading keeps the
// last budget.
func (g *Gate) FailurePolicy() gate.FailurePolicy { return gate.FailKeepLast }

// Describe implements gate.Describer.
func (g *Gate) Describe() string {
	kv := ""
	if g.cfg.KVLimit > 0 {
		kv = fmt.Sprintf(", each pod's KV cache at most %g full", g.cfg.KVLimit)
	}
	burst := ""
	if g.cfg.BurstThreshold > 0 {
		burst = fmt.Sprintf(" in bursts (others ≥ %d within %v; growing one per %v), %d between them,", g.cfg.BurstThreshold,
			g.cfg.BurstWindow, g.cfg.BurstGrowth, *g.cfg.IdleReserve)
	}
	check := "; eviction not checked"
	if g.check != nil {
		check = fmt.Sprintf("; eviction checked (%s) on %s within %d readings, back-off %v", g.cfg.EvictCheck, g.check.series,
			g.cfg.EvictCheckReadings, g.cfg.EvictCheckBackoff)
	}
	where := "pool-wide"
	if g.pods != nil {
		pace := ""
		if g.cfg.PaceTokens > 0 {
			pace = fmt.Sprintf(", paced at %g prompt tokens a second per pod", g.cfg.PaceTokens)
			if g.cfg.BurstPaceTokens > 0 {
				pace += fmt.Sprintf(" (%g in its bursts)", g.cfg.BurstPaceTokens)
			}
		}
		where = fmt.Sprintf("per pod, dispatching to the pods itself (at most %d placement(s) per pod between readings%s; a request taken back resumes on its pod)", g.cfg.PendingPrefills, pace)
	}
	return fmt.Sprintf("keeps %d seats%s (+%g of the other traffic's) free %s of %d×%d%s on %s%s%s", *g.cfg.Reserve, burst, g.cfg.ReserveShare,
		where, len(g.cfg.Endpoints), g.cfg.SeatsPerPod, kv, strings.Join(g.cfg.Endpoints, ","), check, g.share.describe())
}

// Close drops the idle connections and closes the account.
func (g *Gate) Close() error {
	g.tr.CloseIdleConnections()
	return g.share.close()
}

// SetClock replaces the gate's clock (tests).
func (g *Gate) SetClock(now func() time.Time) {
	g.mu.Lock()
	g.now = now
	g.mu.Unlock()
}
