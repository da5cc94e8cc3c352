// Package pipeline is sluice's Watermill router: per queue one handler whose
// subscriber is the claim loop (transport.NewSubscriber) over the queue's
// credits, and whose middleware carries each request to its result. It owns
// the gate refresh loops, the cancellation watch, the sampled gauges, and
// the drain on shutdown.
//
// The flow of one request, in the order handlerOf chains the steps:
//
//   - settler (pipeline.go, write.go): publishes the result the chain
//     returns and settles the delivery;
//   - recoverer (middleware.go): creates the delivery and turns a panic
//     into a result;
//   - recordMetrics (metrics.go): counts how the delivery ended;
//   - decoder and limiter (middleware.go): decode the request, answer one
//     that is invalid or over the limits;
//   - traceSpans (trace.go), when tracing is on;
//   - deadlineCheck (middleware.go): a request already past its deadline;
//   - cancelCheck (cancel.go): a request cancelled before dispatch, and the
//     registration that lets a cancellation abort its call;
//   - validator (middleware.go), when there are transforms;
//   - admission (admission.go): the queue's gate, a worker of the pool's
//     lanes, the pool's gate;
//   - cancelRecheck (cancel.go): a request cancelled while it waited;
//   - retrier (retry.go): re-queues a retryable outcome;
//   - dispatchHandler (dispatch.go): the HTTP call, and its outcome as the
//     request's result.
//
// Everything about cancellation is in cancel.go.
//
// Who publishes the result. The chain ends a request by returning its result
// message; the first middleware, the settler, publishes it through the
// transport's publisher (on Redis that write is the fenced ack of the lease)
// and then settles the delivery (transport.Ack: the source settles and the
// credit is freed; transport.Nack when the chain or the publish failed, which
// hands the delivery back). The handler is registered as a consumer handler,
// without a publisher, so the router publishes nothing and its ack afterwards
// is a no-op.
//
// Letting the router publish instead (AddHandler with the transport's
// publisher, settling from a publisher wrapper) was built and measured: it
// costs 13 more allocations per message (Watermill adds five context values
// to every produced message and builds log-field maps for its trace lines
// whatever the log level), and in alternating runs on the same machine
// (go run ./tools/bench -only core, then -only redis-sortedset -runs 1,
// five of each) the framework's own throughput fell from a median of 89,800
// to 86,200 messages/s (-4%) and the Redis sorted set end to end from 11,877
// to 11,551 requests/s (-2.7%; ratio to its baseline 1.05 -> 1.01), with more
// memory. Above the 2% we allow for the shape, so the settler publishes.
//
// Shutdown, in order: stop claiming (the router closes the subscribers); let
// the requests in flight finish for up to DrainTimeout; cancel the rest with
// cause errShutdown, which makes their handlers nack them back to the
// transport; close the result publishers, the gates and the transport. No
// request is lost.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transform"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Queue is one queue of the pipeline: the transport's queue (names and
// in-flight limit at budget 1, MaxConcurrency) and what the pipeline adds to
// it. The pipeline keeps its own copy, with the state New gives it.
type Queue struct {
	transport.Queue
	// Target is the gateway of this queue.
	Target dispatch.Target
	// Gate is the refresh loop of the queue's gate; queues may share one.
	Gate *gate.Refresher
	// Ramp bounds how fast credits return when the budget rises.
	Ramp credit.Ramp
	// WorkerPool is the worker pool the queue belongs to (the pool_name
	// metric label; default "default"). When Config.Pools is not empty it
	// must name one of them.
	WorkerPool string
	// Labels are set on each request taken from the queue that does not
	// carry them already (upstream's queue labels: the tier, ...).
	Labels map[string]string
	// Evict takes requests back when the gate's measured budget falls
	// below what the queue has in flight: the youngest calls over the new
	// limit are aborted and re-queued due now, without counting an
	// attempt (see evictor). Off: a falling budget only stops new claims.
	Evict bool
	// EvictLimit is how many times one request may be taken back (0: the
	// default, DefaultEvictLimit; negative: no limit). A request taken back
	// that often runs to its end: without a limit, a long generation
	// restarted after one burst is among the youngest calls at the next,
	// and may never finish.
	EvictLimit int
	// Resume (with Evict) continues a request taken back from the tokens
	// its aborted call had made (core/resume) instead of starting it again.
	Resume bool

	evictor  *evictor      // with Evict: the calls it may take back
	pool     *Pool         // the worker pool (nil: none configured)
	priority *Priority     // the tier-priority policy (nil: random-robin)
	credits  *credit.Pool  // the in-flight allowance, following Gate's budget
	metrics  *queueMetrics // the queue's metrics
	admitter gate.Admitter // Gate's per-request hook; nil: always admit

	spec      queueSpec          // what New or Reconfigure was given, to tell a changed queue
	followers []gate.Follower    // what the queue attached to Gate (detached when it is removed)
	sub       message.Subscriber // the claim loop (set when its handler is added)
	pub       message.Publisher  // the result publisher (set when its handler is added)
	workers   *workers           // the goroutines its handler runs on (set with the handler)
}

// queueSpec is the part of a Queue its caller gives, in a form that
// compares: Reconfigure keeps a queue whose spec is unchanged.
type queueSpec struct {
	queue  transport.Queue
	target dispatch.Target
	gate   *gate.Refresher
	ramp   credit.Ramp
	pool   string
	labels map[string]string
	evict  bool
	limit  int
	resume bool
}

func specOf(q Queue) queueSpec {
	return queueSpec{queue: q.Queue, target: q.Target, gate: q.Gate, ramp: q.Ramp, pool: q.WorkerPool, labels: q.Labels, evict: q.Evict, limit: q.EvictLimit, resume: q.Resume}
}

// equal reports whether s and o configure the queue alike.
func (s queueSpec) equal(o queueSpec) bool {
	return s.queue == o.queue && s.target == o.target && s.gate == o.gate && s.ramp == o.ramp &&
		s.pool == o.pool && maps.Equal(s.labels, o.labels) && s.evict == o.evict && s.limit == o.limit && s.resume == o.resume
}

// defaultWorkerPool is the worker pool of a queue that names none.
const defaultWorkerPool = "default"

// Config configures a Pipeline.
type Config struct {
	Transport  transport.Transport
	Dispatcher Dispatcher
	Queues     []Queue
	// Pools are the worker pools the queues name (none: each queue is
	// bounded by its own credits only).
	Pools []Pool
	// Transforms rewrite request bodies (nil: none): checked once per
	// delivery before the gates, applied to each attempt.
	Transforms *transform.Chain
	// Priority, when set, is upstream's tier-priority merge policy: a
	// pool's workers go to requests by lane (see lanes.go). nil: upstream's
	// random-robin, the pool's workers taken when requests are claimed.
	Priority *Priority
	// GateTimeout bounds how long a request may wait on Wait decisions and
	// for a worker of the lanes before it is re-queued (upstream's
	// --gate-wait-timeout; 0: the default, 5m; negative: only the
	// deadline bounds the wait).
	GateTimeout time.Duration
	Retry       RetryPolicy
	// DrainTimeout is how long requests in flight may finish after shutdown
	// begins (default 2m).
	DrainTimeout time.Duration
	// ResultWriteTimeout bounds how long a delivery is held while writing
	// its result is retried (default 5m; a transport's HoldLimiter may
	// bound it further); then the request is handed back with the result
	// kept (see write.go).
	ResultWriteTimeout time.Duration
	// ResultHandBackDelay is when a request handed back with its result
	// kept comes back (default 30s; at shutdown: at once).
	ResultHandBackDelay time.Duration
	// Limits bound what a request may carry (zero fields: wire's defaults).
	Limits wire.Limits
	// HandBackTimeout bounds the wait for cancelled requests to be handed
	// back after the drain (default 10s).
	HandBackTimeout time.Duration
	// GaugeInterval is how often gauges are sampled (default 2s).
	GaugeInterval time.Duration
	// DepthInterval is how often queue depths are read from the broker
	// (0: GaugeInterval; negative: never).
	DepthInterval time.Duration
	// Metrics receives the metrics (required).
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	// TracerProvider, when set, traces every request (a span per delivery,
	// W3C trace context to the gateway); nil: no tracing, no cost.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 2 * time.Minute
	}
	if c.ResultWriteTimeout <= 0 {
		c.ResultWriteTimeout = 5 * time.Minute
	}
	if c.ResultHandBackDelay <= 0 {
		c.ResultHandBackDelay = 30 * time.Second
	}
	if c.HandBackTimeout <= 0 {
		c.HandBackTimeout = 10 * time.Second
	}
	c.Limits.SetDefaults()
	if c.GaugeInterval <= 0 {
		c.GaugeInterval = 2 * time.Second
	}
	if c.GateTimeout == 0 {
		c.GateTimeout = 5 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Retry.SetDefaults()
}

// Validate reports a configuration the pipeline cannot run.
func (c *Config) Validate() error {
	var errs []error
	if c.Transport == nil {
		errs = append(errs, errors.New("pipeline: no transport"))
	}
	if c.Dispatcher == nil {
		errs = append(errs, errors.New("pipeline: no dispatcher"))
	}
	if c.Metrics == nil {
		errs = append(errs, errors.New("pipeline: no metrics"))
	}
	if len(c.Queues) == 0 {
		errs = append(errs, errors.New("pipeline: no queues"))
	}
	errs = append(errs, checkQueues(c.Queues)...)
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Priority != nil {
		if err := c.Priority.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkQueues reports queues the pipeline cannot run: an empty id or
// name, a duplicate id or name, no gate, a max concurrency below 1.
func checkQueues(qs []Queue) []error {
	var errs []error
	ids, names := map[string]bool{}, map[string]bool{}
	for i, q := range qs {
		switch {
		case q.ID == "" || q.Name == "":
			errs = append(errs, fmt.Errorf("pipeline: queue %d: empty id or name", i))
		case ids[q.ID]:
			errs = append(errs, fmt.Errorf("pipeline: queue %d: duplicate id %q", i, q.ID))
		case names[q.Name]:
			errs = append(errs, fmt.Errorf("pipeline: queue %d: duplicate queue name %q", i, q.Name))
		case q.Gate == nil:
			errs = append(errs, fmt.Errorf("pipeline: queue %q: no gate", q.ID))
		case q.MaxConcurrency < 1:
			errs = append(errs, fmt.Errorf("pipeline: queue %q: max concurrency %d < 1", q.ID, q.MaxConcurrency))
		}
		ids[q.ID], names[q.Name] = true, true
	}
	return errs
}

// Pipeline runs the queues of one deployment.
type Pipeline struct {
	cfg      Config
	log      *slog.Logger
	inflight *inflightIndex
	delay    *delayQueue
	pools    map[string]*Pool
	draining chan struct{} // closed when shutdown begins
	ready    atomic.Bool
	handlers running

	// mu guards what Reconfigure changes while the pipeline runs.
	mu     sync.Mutex
	queues []*Queue // the queues claiming now
	// retiring are queues a Reconfigure removed whose requests in flight
	// have not all settled yet.
	retiring []*Queue
	// publishers are the queues' result publishers, closed after the drain
	// (the router is not given them), or once a removed queue drained.
	publishers []message.Publisher
	// gates are the gate loops started (by Run, or by Reconfigure for the
	// gates of the queues it added); Run closes them at the end.
	gates  map[*gate.Refresher]bool
	router *message.Router // set while Run runs
	work   context.Context // Run's work context, for the handlers Reconfigure adds
	seq    int             // numbers the handlers Reconfigure adds (router names are unique)
	keeper bool            // the idle handler that keeps the router up with no queues was added

	reconf sync.Mutex // one Reconfigure at a time
}

// New validates cfg and builds the pipeline.
func New(cfg Config) (*Pipeline, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Priority != nil {
		pr := *cfg.Priority
		pr.init()
		cfg.Priority = &pr
	}
	p := &Pipeline{cfg: cfg, log: cfg.Logger, draining: make(chan struct{}), gates: map[*gate.Refresher]bool{}}
	pools, err := initPools(&p.cfg)
	if err != nil {
		return nil, err
	}
	p.pools = pools
	_, watches := cfg.Transport.(transport.CancelWatcher)
	_, checks := cfg.Transport.(transport.CancelChecker)
	if watches || checks {
		p.inflight = newInflightIndex()
	}
	if _, ok := cfg.Transport.(transport.Requeuer); !ok {
		rp, ok := cfg.Transport.(transport.RequestPublisher)
		if !ok {
			return nil, errors.New("pipeline: the transport can neither re-queue nor publish requests, so retries are impossible")
		}
		p.delay = newDelayQueue(rp, cfg.Logger)
	}
	for _, spec := range cfg.Queues {
		q, err := p.initQueue(spec)
		if err != nil {
			return nil, err
		}
		p.queues = append(p.queues, q)
	}
	return p, nil
}

// initQueue builds the pipeline's state of queue spec: its credits,
// following its gate (and, under tier-priority, its source in the pool's
// lanes), and its metrics.
func (p *Pipeline) initQueue(spec Queue) (*Queue, error) {
	if spec.WorkerPool == "" {
		spec.WorkerPool = defaultWorkerPool
	}
	q := spec
	q.spec = specOf(spec)
	if len(p.pools) > 0 {
		if q.pool = p.pools[q.WorkerPool]; q.pool == nil {
			return nil, fmt.Errorf("pipeline: queue %q: worker pool %q not found", q.ID, q.WorkerPool)
		}
	}
	if q.Evict && q.pool != nil && q.pool.lanes != nil {
		return nil, fmt.Errorf("pipeline: queue %q: evict is not supported in worker pool %q under the tier-priority policy (its lanes, not the queue's credits, bound what runs)", q.ID, q.WorkerPool)
	}
	if q.Resume && !q.Evict {
		return nil, fmt.Errorf("pipeline: queue %q: resume needs evict (only a request taken back is resumed)", q.ID)
	}
	claims := q.MaxConcurrency
	if q.pool != nil && q.pool.lanes != nil {
		// Under tier-priority the lanes bound the queue's requests in
		// flight; its claims may run as many again ahead of them, so
		// that the next request already waits in its lane when one
		// ends (see lanes.go).
		claims = 2 * q.MaxConcurrency
		f := q.pool.lanes.addSource(q.ID, q.MaxConcurrency)
		q.Gate.Attach(f)
		q.followers = append(q.followers, f)
	}
	q.credits = credit.NewPool(claims, q.Ramp)
	q.priority = p.cfg.Priority
	q.metrics = newQueueMetrics(p.cfg.Metrics, transport.MetricLabelsOf(p.cfg.Transport, q.Queue), q.WorkerPool)
	q.admitter, _ = q.Gate.Gate().(gate.Admitter)
	q.metrics.own.InflightMax.Set(float64(q.MaxConcurrency))
	q.Gate.Attach(q.credits)
	q.followers = append(q.followers, q.credits)
	if q.Evict {
		// after the credits: it reads their in-flight count
		q.evictor = newEvictor(&q, p.log, p.cfg.Metrics.EvictSuspended)
		q.Gate.Attach(q.evictor)
		q.followers = append(q.followers, q.evictor)
	}
	return &q, nil
}

// Ready reports whether the pipeline is claiming requests (for /readyz).
func (p *Pipeline) Ready() bool { return p.ready.Load() }

// current returns the queues claiming now.
func (p *Pipeline) current() []*Queue {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.queues)
}

// Credits returns the credits of queue id (nil if unknown); for tests and benchmarks.
func (p *Pipeline) Credits(id string) *credit.Pool {
	for _, q := range p.current() {
		if q.ID == id {
			return q.credits
		}
	}
	return nil
}

// ObserveLanes makes f see every step of the tier-priority lanes of worker
// pool id (see LaneEvent), in the order the lanes took them, from now on;
// for tests and benchmarks that check the dispatch order (tools/bench's
// flow-control scenario). f is called with the pool's lanes locked: it must
// return quickly and must not call into the pipeline. A nil f stops the
// observation. It reports false when the pool has no lanes (no such pool,
// or not the tier-priority policy). Unobserved, the lanes pay one nil check
// per step.
func (p *Pipeline) ObserveLanes(id string, f func(LaneEvent)) bool {
	pool := p.pools[id]
	if pool == nil || pool.lanes == nil {
		return false
	}
	pool.lanes.mu.Lock()
	pool.lanes.observe = f
	pool.lanes.mu.Unlock()
	return true
}

func (p *Pipeline) deadLetter(ctx context.Context, d *delivery, reason string) error {
	if dl, ok := p.cfg.Transport.(transport.DeadLetterer); ok {
		return dl.DeadLetter(ctx, d.Queue.Queue, d.Msg, reason)
	}
	// No dead-letter destination: the message is logged whole so it is not lost silently.
	p.log.Error("message without a readable id and no dead-letter destination", "queue", d.Queue.ID, "reason", reason, "payload", string(d.Msg.Payload))
	return nil
}

// settler publishes the result the chain returns through the queue's
// result writer and then settles the delivery through transport.Ack (or
// transport.Nack when the chain failed, or the result could neither be
// written nor handed back with it; see write.go), which runs the claim
// loop's settle hook: the source settles and the credit is freed. It also
// counts the handler as running until then, so the shutdown can wait for
// hand-backs and for results being written. See the package doc for why
// the router does not publish.
func (p *Pipeline) settler(w *resultWriter) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			p.handlers.add(1)
			defer p.handlers.add(-1)
			defer afterSettle(m)
			out, err := next(m)
			if err != nil {
				transport.Nack(m)
				return nil, err
			}
			if len(out) > 0 {
				if w.early.take() {
					// The call is over: its credit may take the next request
					// while the result is written.
					transport.FreeCredit(m)
					defer w.early.give()
				}
				return nil, w.write(m, out)
			}
			transport.Ack(m)
			return nil, nil
		}
	}
}

// Run runs until ctx ends, then drains and returns. It returns an error when
// the pipeline could not start or requests could not be handed back.
func (p *Pipeline) Run(ctx context.Context) error {
	// work bounds the requests: it outlives ctx by the drain, then its cause
	// (errShutdown) makes the handlers still running hand their deliveries back.
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(errShutdown)

	stopGates := p.startGates(work) // first: queues start with a real budget
	defer stopGates()
	if p.delay != nil {
		go p.delay.run(work)
	}
	router, err := p.newRouter(work)
	if err != nil {
		return err
	}
	p.watchCancellations(work)
	p.pollCancels(work)
	routerDone, err := p.startRouter(ctx, router)
	if err != nil {
		// Nothing was claimed: release the transport's clients and report why.
		return errors.Join(err, p.cfg.Transport.Close())
	}
	p.mu.Lock()
	p.router, p.work = router, work
	n := len(p.queues)
	p.mu.Unlock()
	p.ready.Store(true)
	p.log.Info("pipeline running", "queues", n)
	gaugesDone := make(chan struct{})
	go p.gauges(work, gaugesDone)

	<-ctx.Done()
	p.reconf.Lock() // a Reconfigure under way finishes first; later ones see draining
	p.ready.Store(false)
	close(p.draining)
	p.reconf.Unlock()
	drained := p.drain(router)
	stopWork(errShutdown)
	<-gaugesDone
	return p.handBack(drained, routerDone)
}

// startGates starts the refresh loop of every distinct gate and returns the
// function that closes them.
func (p *Pipeline) startGates(ctx context.Context) (stop func()) {
	for _, r := range p.refreshers() {
		p.startGate(ctx, r)
	}
	return func() {
		p.mu.Lock()
		var refreshers []*gate.Refresher
		for r := range p.gates {
			refreshers = append(refreshers, r)
		}
		p.mu.Unlock()
		for _, r := range refreshers {
			if err := r.Close(); err != nil {
				p.log.Warn("closing gate", "err", err)
			}
		}
	}
}

// startGate starts r's loop unless it runs already.
func (p *Pipeline) startGate(ctx context.Context, r *gate.Refresher) {
	p.mu.Lock()
	started := p.gates[r]
	p.gates[r] = true
	p.mu.Unlock()
	if !started {
		r.Start(ctx)
	}
}

// newRouter builds the Watermill router: per queue one consumer handler
// reading the claim loop's subscriber and running the middleware chain in
// front of the dispatch handler, the settler first: it publishes the result.
func (p *Pipeline) newRouter(work context.Context) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: p.cfg.DrainTimeout}, newRouterLogger(p.log))
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	for _, q := range p.queues {
		if err := p.openQueue(q); err != nil {
			return nil, err
		}
		router.AddConsumerHandler(q.ID, q.Name, q.sub, p.handlerOf(work, q))
	}
	return router, nil
}

// openQueue builds q's claim loop (q.sub) and result publisher (q.pub,
// also kept in p.publishers).
func (p *Pipeline) openQueue(q *Queue) error {
	var credits credit.Credits = q.credits
	if q.pool != nil && q.pool.lanes == nil {
		credits = credit.Both(q.credits, q.pool.shared)
	}
	sub, err := transport.NewSubscriber(p.cfg.Transport, q.Queue, credits, p.log)
	if err != nil {
		return fmt.Errorf("queue %s: subscriber: %w", q.ID, err)
	}
	pub, err := p.cfg.Transport.Publisher(q.Queue)
	if err != nil {
		_ = sub.Close()
		return fmt.Errorf("queue %s: publisher: %w", q.ID, err)
	}
	q.sub, q.pub = sub, pub
	p.mu.Lock()
	p.publishers = append(p.publishers, pub)
	p.mu.Unlock()
	return nil
}

// handlerOf returns the router handler of q: the middleware chain, the
// settler first, in front of the dispatch handler.
func (p *Pipeline) handlerOf(work context.Context, q *Queue) message.NoPublishHandlerFunc {
	var checker transport.CancelChecker
	if c, ok := p.cfg.Transport.(transport.CancelChecker); ok {
		checker = c
	}
	chain := []message.HandlerMiddleware{
		p.settler(p.newResultWriter(work, q.pub, q)),
		recoverer(q, work, p.deadLetter, p.log),
		recordMetrics(q),
		decoder(p.deadLetter, p.log),
		limiter(p.cfg.Limits),
	}
	if p.cfg.TracerProvider != nil {
		chain = append(chain, traceSpans(p.cfg.TracerProvider))
	}
	chain = append(chain,
		deadlineCheck(),
		cancelCheck(checker, p.inflight, p.log),
	)
	if p.cfg.Transforms != nil && p.cfg.Transforms.Len() > 0 {
		chain = append(chain, validator(p.cfg.Transforms))
	}
	chain = append(chain,
		admission(p.requeue, time.Second, p.cfg.GateTimeout, p.draining, p.log),
		cancelRecheck(checker, p.log),
		retrier(p.cfg.Retry, p.requeue),
	)
	handler := dispatchHandler(p.cfg.Dispatcher, p.cfg.Transforms)
	for i := len(chain) - 1; i >= 0; i-- {
		handler = chain[i](handler)
	}
	// The settler published the result: the router publishes nothing.
	q.workers = newWorkers(work, func(m *message.Message) error {
		_, err := handler(m)
		return err
	})
	return q.workers.run
}

// startRouter runs the router until it is closed and returns once it runs;
// the channel gets Run's result.
func (p *Pipeline) startRouter(ctx context.Context, router *message.Router) (<-chan error, error) {
	done := make(chan error, 1)
	go func() { done <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
		return done, nil
	case err := <-done:
		return nil, fmt.Errorf("router: %w", err)
	}
}

// drain stops the claims (closing the router closes the subscribers) and
// lets the requests in flight finish for up to the drain timeout; it
// reports whether they all did.
func (p *Pipeline) drain(router *message.Router) bool {
	p.log.Info("shutting down: no new claims; draining requests in flight", "drain_timeout", p.cfg.DrainTimeout.String())
	if err := router.Close(); err != nil {
		p.log.Warn("drain timeout reached; handing the rest back", "err", err)
		return false
	}
	return true
}

// handBack waits for the handlers cancelled after the drain to hand their
// deliveries back, flushes the generic delay queue, and closes the
// transport (which hands back whatever is still un-acked).
func (p *Pipeline) handBack(drained bool, routerDone <-chan error) error {
	var result error
	if !p.handlers.waitZero(p.cfg.HandBackTimeout) {
		result = errors.New("requests still running after the hand-back timeout")
	}
	if err := <-routerDone; err != nil && result == nil && drained {
		result = fmt.Errorf("router: %w", err)
	}
	if p.delay != nil {
		p.delay.flush(context.Background())
	}
	p.mu.Lock()
	publishers := slices.Clone(p.publishers)
	p.publishers = nil
	p.mu.Unlock()
	for _, pub := range publishers {
		if err := pub.Close(); err != nil {
			result = errors.Join(result, fmt.Errorf("close result publisher: %w", err))
		}
	}
	if err := p.cfg.Transport.Close(); err != nil {
		result = errors.Join(result, fmt.Errorf("close transport: %w", err))
	}
	p.log.Info("pipeline stopped")
	return result
}

// refreshers lists the distinct gate loops of the queues.
func (p *Pipeline) refreshers() []*gate.Refresher {
	var out []*gate.Refresher
	seen := map[*gate.Refresher]bool{}
	for _, q := range p.queues {
		if !seen[q.Gate] {
			seen[q.Gate] = true
			out = append(out, q.Gate)
		}
	}
	for _, pl := range p.cfg.Pools {
		if pl.Gate != nil && !seen[pl.Gate] {
			seen[pl.Gate] = true
			out = append(out, pl.Gate)
		}
	}
	return out
}

// gauges samples credits, budgets and queue depths until ctx ends.
func (p *Pipeline) gauges(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	dr, _ := p.cfg.Transport.(transport.DepthReporter)
	every, depthEvery := p.cfg.GaugeInterval, p.cfg.DepthInterval
	switch {
	case depthEvery == 0:
		depthEvery = every
	case depthEvery < 0:
		dr = nil
	case depthEvery < every:
		every = depthEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var lastDepth time.Time
	for {
		var depths transport.DepthReporter
		if dr != nil && time.Since(lastDepth) >= depthEvery-every/2 {
			depths, lastDepth = dr, time.Now()
		}
		for _, q := range p.current() {
			p.sampleQueue(ctx, q, depths)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// running counts handlers in flight. Unlike a WaitGroup, it may be
// incremented while someone waits for zero (a handler the router starts
// late during shutdown), which the drain needs.
type running struct {
	mu      sync.Mutex
	n       int
	changed chan struct{} // closed and replaced at every change to zero
}

func (r *running) add(d int) {
	r.mu.Lock()
	r.n += d
	if r.n == 0 && r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
	r.mu.Unlock()
}

// waitZero waits up to d for no handler to be running.
func (r *running) waitZero(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		if r.n == 0 {
			r.mu.Unlock()
			return true
		}
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}
