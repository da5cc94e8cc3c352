package poolsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Record describes one finished (or aborted) request, for Pool.OnRecord.
type Record struct {
	// ID numbers the request within the pool (from 1).
	ID uint64
	// Class is the request's traffic class; Pod the pod that served it.
	Class Class
	Pod   int
	// Priority is the front's (EPP) priority; EnginePriority the engine's.
	Priority, EnginePriority int
	// PromptTokens and OutputTokens are the request's sizes (OutputTokens:
	// tokens generated, fewer than MaxTokens when aborted).
	PromptTokens, OutputTokens, MaxTokens int
	// Arrival is when the request reached the simulator (front or pod);
	// FirstScheduled when the engine first scheduled it; FirstToken when its
	// first token came; Finished when it ended. Zero when it did not happen.
	Arrival, FirstScheduled, FirstToken, Finished time.Time
	// Preemptions is how often the engine preempted it.
	Preemptions int
	// FinishReason is "length", "stop" or "abort".
	FinishReason string
}

// TTFT is FirstToken − Arrival, or 0 without a first token.
func (r Record) TTFT() time.Duration {
	if r.FirstToken.IsZero() {
		return 0
	}
	return r.FirstToken.Sub(r.Arrival)
}

// ClassStats counts one class's requests since New (or ResetStats).
type ClassStats struct {
	// Requests is the number of completion requests received.
	Requests uint64 `json:"requests"`
	// Rejected is the number the front refused (429, 503).
	Rejected uint64 `json:"rejected"`
	// Invalid is the number answered 400 or 413.
	Invalid uint64 `json:"invalid"`
	// Finished is the number that completed; Aborted the number whose client
	// went away first.
	Finished uint64 `json:"finished"`
	Aborted  uint64 `json:"aborted"`
	// PromptTokens and OutputTokens are summed over finished requests.
	PromptTokens uint64 `json:"prompt_tokens"`
	OutputTokens uint64 `json:"output_tokens"`
	// Preemptions is summed over finished and aborted requests.
	Preemptions uint64 `json:"preemptions"`
}

type classCounters struct {
	requests, rejected, invalid, finished, aborted atomic.Uint64
	prompt, output, preemptions                    atomic.Uint64
}

// Stats is a snapshot of a Pool.
type Stats struct {
	// Classes is indexed by Class.
	Classes [numClasses]ClassStats
	// Rejections counts front refusals by reason (rejected-saturated,
	// rejected-ttl-expired, band-full).
	Rejections map[string]uint64
	// StepLag is the step lag of every pod.
	StepLag LagStats
}

// Pool is a simulated inference pool: engine pods behind an EPP-like front.
type Pool struct {
	cfg   Config
	seed  uint64
	pods  []*pod
	front *front
	lag   lagRecorder
	ids   atomic.Uint64
	cls   [numClasses]classCounters

	onRecord func(Record)
	handler  http.Handler
	// ignoreHangups is Engine.IgnoreHangups, changed by SetIgnoreHangups.
	ignoreHangups atomic.Bool

	mu        sync.Mutex
	started   bool
	stop      context.CancelFunc
	loops     sync.WaitGroup
	closed    chan struct{} // closed by Close: handlers give up
	closeOnce sync.Once
	srv       *http.Server
	srvDone   chan struct{}
	srvErr    error
}

// New validates cfg, applies its defaults and returns a Pool; Start runs it.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.SetDefaults()
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = rand.Uint64()
	}
	p := &Pool{cfg: cfg, seed: seed, closed: make(chan struct{})}
	p.pods = make([]*pod, cfg.Pods)
	for i := range p.pods {
		p.pods[i] = newPod(p, i, newEngine(cfg.Engine, newRNG(seed, uint64(i))))
	}
	p.front = newFront(p)
	p.ignoreHangups.Store(cfg.Engine.IgnoreHangups)
	h, err := p.newHandler()
	if err != nil {
		return nil, fmt.Errorf("poolsim: metrics: %w", err)
	}
	p.handler = h
	return p, nil
}

// Config returns the pool's configuration with its defaults applied.
func (p *Pool) Config() Config { return p.cfg }

// SetIgnoreHangups changes, while the pool runs, what happens to a request
// whose client goes away from now on (see EngineConfig.IgnoreHangups):
// true runs it to its end, false aborts it.
func (p *Pool) SetIgnoreHangups(on bool) { p.ignoreHangups.Store(on) }

// OnRecord sets fn to be called once per finished or aborted request, from
// the goroutine that ended it; fn must be quick and safe for concurrent
// use. Set it before Start.
func (p *Pool) OnRecord(fn func(Record)) { p.onRecord = fn }

// Start runs the pods' step loops and the front until ctx ends or Close;
// when ctx ends, requests in flight get 503 or an aborted stream. A Pool
// starts at most once.
func (p *Pool) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errors.New("poolsim: start: already started")
	}
	p.started = true
	ctx, p.stop = context.WithCancel(ctx)
	for _, d := range p.pods {
		p.loops.Go(func() { d.run(ctx) })
	}
	p.front.refresh(time.Now())
	p.loops.Go(func() { p.front.loop(ctx) })
	p.loops.Go(func() {
		<-ctx.Done() // the loops stop: requests in flight give up
		p.closeOnce.Do(func() { close(p.closed) })
	})
	return nil
}

// Handler serves the front (POST /v1/completions, /v1/chat/completions,
// GET /metrics, /healthz) and the pods (GET /pods/{i}/metrics, POST
// /pods/{i}/v1/...). Completion requests wait for Start.
func (p *Pool) Handler() http.Handler { return p.handler }

// Listen serves Handler on addr (e.g. "127.0.0.1:0") and returns the base
// URL; Close stops it.
func (p *Pool) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("poolsim: listen on %s: %w", addr, err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: p.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, Protocols: &protos}
	done := make(chan struct{})
	p.mu.Lock()
	if p.srv != nil {
		p.mu.Unlock()
		_ = ln.Close()
		return "", errors.New("poolsim: listen: already listening")
	}
	p.srv, p.srvDone = srv, done
	p.mu.Unlock()
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			p.mu.Lock()
			p.srvErr = fmt.Errorf("poolsim: serve: %w", err)
			p.mu.Unlock()
		}
	}()
	return "http://" + ln.Addr().String(), nil
}

// Close stops the listener (letting requests finish for up to
// ShutdownTimeout), then the loops; requests still in flight get 503 or an
// aborted stream. It is safe to call more than once.
func (p *Pool) Close() error {
	p.mu.Lock()
	srv, done := p.srv, p.srvDone
	p.srv = nil
	stop := p.stop
	p.mu.Unlock()
	var errs []error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ShutdownTimeout)
		if err := srv.Shutdown(ctx); err != nil {
			p.closeOnce.Do(func() { close(p.closed) })
			if err := srv.Close(); err != nil {
				errs = append(errs, fmt.Errorf("poolsim: close: %w", err))
			}
		}
		cancel()
		<-done
	}
	p.closeOnce.Do(func() { close(p.closed) })
	if stop != nil {
		stop()
	}
	p.loops.Wait()
	p.front.rejectAll()
	p.mu.Lock()
	if p.srvErr != nil {
		errs = append(errs, p.srvErr)
	}
	p.mu.Unlock()
	return errors.Join(errs...)
}

// Saturation is the pool saturation the front's detector reads now: what
// the EPP exports as llm_d_epp_flow_control_pool_saturation{stage="effective"}
// (an in-process gate reads it here, without Prometheus).
func (p *Pool) Saturation() float64 { return p.front.currentSaturation(time.Now()) }

// PodGauges returns a live reading of every pod.
func (p *Pool) PodGauges() []PodGauges {
	g := make([]PodGauges, len(p.pods))
	for i, d := range p.pods {
		g[i] = d.gauges()
	}
	return g
}

// StepLag returns the step lag measured so far.
func (p *Pool) StepLag() LagStats { return p.lag.snapshot(false) }

// SetPodStalled makes the front's reads of pod i fail (stalled true) or
// work again: its last read ages and, past the staleness threshold, the pod
// scores 1.0 as an unreachable pod does in the EPP.
func (p *Pool) SetPodStalled(i int, stalled bool) { p.pods[i].stalled.Store(stalled) }

// Stats returns a snapshot of the per-class counters, the front's
// rejections and the step lag.
func (p *Pool) Stats() Stats { return p.stats(false) }

// ResetStats returns Stats and zeroes the counters and step-lag samples
// (the Prometheus series are never reset), so a benchmark can measure one
// phase.
func (p *Pool) ResetStats() Stats { return p.stats(true) }

func (p *Pool) classStats(reset bool) [numClasses]ClassStats {
	var out [numClasses]ClassStats
	load := func(a *atomic.Uint64) uint64 {
		if reset {
			return a.Swap(0)
		}
		return a.Load()
	}
	for c := range p.cls {
		k := &p.cls[c]
		out[c] = ClassStats{
			Requests: load(&k.requests), Rejected: load(&k.rejected), Invalid: load(&k.invalid),
			Finished: load(&k.finished), Aborted: load(&k.aborted),
			PromptTokens: load(&k.prompt), OutputTokens: load(&k.output), Preemptions: load(&k.preemptions),
		}
	}
	return out
}

func (p *Pool) stats(reset bool) Stats {
	s := Stats{Classes: p.classStats(reset)}
	p.front.mu.Lock()
	s.Rejections = make(map[string]uint64, len(p.front.rejected))
	for k, v := range p.front.rejected {
		if d := v - p.front.rejectedBase[k]; d > 0 {
			s.Rejections[k] = d
		}
		if reset {
			p.front.rejectedBase[k] = v
		}
	}
	p.front.mu.Unlock()
	s.StepLag = p.lag.snapshot(reset)
	return s
}

// finished accounts for s, which ended in pod d (the pod's lock is not
// held).
func (p *Pool) finished(d *pod, s *seq) {
	r := s.req
	if r.viaFront {
		p.front.done(d.idx)
	}
	k := &p.cls[s.class]
	if s.reason == finishAbort {
		k.aborted.Add(1)
	} else {
		k.finished.Add(1)
		k.prompt.Add(uint64(s.prompt))
		k.output.Add(uint64(s.output))
	}
	k.preemptions.Add(uint64(s.preemptions))
	if fn := p.onRecord; fn != nil {
		fn(Record{
			ID: r.id, Class: s.class, Pod: d.idx, Priority: r.eppPriority, EnginePriority: s.priority,
			PromptTokens: s.prompt, OutputTokens: s.output, MaxTokens: s.maxTokens,
			Arrival: r.arrival, FirstScheduled: s.firstSched, FirstToken: s.firstToken, Finished: s.finished,
			Preemptions: s.preemptions, FinishReason: s.reason,
		})
	}
}

// Sample is a point of a pool's timeline: cumulative counters and gauges,
// read at one time (Pool.Sample). Differences of two samples give rates.
type Sample struct {
	// Time is when the sample was taken.
	Time time.Time `json:"time"`
	// Saturation is the front detector's reading.
	Saturation float64 `json:"saturation"`
	// KVUsage is the average over pods.
	KVUsage float64 `json:"kv_usage"`
	// Preemptions is vllm:num_preemptions_total summed over pods.
	Preemptions uint64 `json:"preemptions"`
	// StepLagMaxMS is the largest step lag so far, in milliseconds.
	StepLagMaxMS float64 `json:"step_lag_max_ms"`
	// ByClass is indexed by Class.
	ByClass [numClasses]ClassSample `json:"by_class"`
}

// ClassSample is one class's part of a Sample.
type ClassSample struct {
	// Class is "interactive" or "batch".
	Class string `json:"class"`
	// Running and Waiting are summed over pods.
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// ClassStats are the cumulative counters (since New or ResetStats).
	ClassStats
}

// Sample reads the pool's counters and gauges now. It is cheap enough to
// call every few milliseconds.
func (p *Pool) Sample() Sample {
	s := Sample{Time: time.Now(), Saturation: p.Saturation()}
	cls := p.classStats(false)
	for c := range numClasses {
		s.ByClass[c] = ClassSample{Class: Class(c).String(), ClassStats: cls[c]}
	}
	for _, g := range p.PodGauges() {
		for c := range numClasses {
			s.ByClass[c].Running += g.RunningByClass[c]
			s.ByClass[c].Waiting += g.WaitingByClass[c]
		}
		s.KVUsage += g.KVUsage / float64(len(p.pods))
		s.Preemptions += g.Preemptions
	}
	p.lag.mu.Lock()
	s.StepLagMaxMS = float64(p.lag.max) / float64(time.Millisecond)
	p.lag.mu.Unlock()
	return s
}
