// Package metrics defines sluice's Prometheus metrics. The names under the
// llm_d_async_async_ prefix are upstream's, with upstream's meanings,
// labels and buckets, so its dashboards and alert rules read them as they
// read upstream (docs/metrics.md lists each one and where sluice differs);
// the sluice_ names are sluice's own figures. Every metric is registered on
// the registry the caller passes: there is no global state.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Upstream is the prefix of the metrics kept compatible with llm-d-async.
const Upstream = "llm_d_async_async_"

// Labels are upstream's per-queue labels (queue_id, queue_name, pool_name).
// Pool is the worker pool ("default" when the queue names none), not the
// inference pool.
type Labels struct {
	QueueID, QueueName, Pool string
}

func (l Labels) values(extra ...string) []string {
	return append([]string{l.QueueID, l.QueueName, l.Pool}, extra...)
}

var queueLabels = []string{"queue_id", "queue_name", "pool_name"}

// Upstream's gate decision reasons: only decisions that kept a request from
// being dispatched are counted.
const (
	ReasonGateClosed     = "gate_closed"     // a closed gate (budget 0 with requests waiting, or a deferral)
	ReasonQuotaExhausted = "quota_exhausted" // a deferral a gate classified as over quota
	ReasonDropped        = "dropped"         // a gate dropped the request (GATE_DROPPED)
	ReasonError          = "error"           // the gate failed
)

// DecisionReasons are the values of the reason label of gate_decisions_total.
var DecisionReasons = []string{ReasonGateClosed, ReasonQuotaExhausted, ReasonDropped, ReasonError}

// Verdicts are the values of the verdict label of sluice_gate_verdicts_total.
var Verdicts = []string{"admit", "defer", "reject", "wait", "error"}

// ResultCodes are the values of the code label of sluice_results_total:
// "ok", "http_error" (the gateway's final answer of status 400 or above,
// passed on without an error code) and the error codes.
var ResultCodes = []string{"ok", "http_error", "DEADLINE_EXCEEDED", "CANCELLED", "GATE_DROPPED", "GATE_ERROR", "INFERENCE_ERROR", "INVALID_REQUEST"}

// The values of the result label of queue_config_reloads_total, upstream's.
const (
	ReloadSuccess = "success"
	ReloadError   = "error"
)

// ReloadResults are the values of the result label of
// queue_config_reloads_total.
var ReloadResults = []string{ReloadSuccess, ReloadError}

// Upstream's buckets, in milliseconds.
var (
	inferenceBuckets = []float64{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000}
	residenceBuckets = []float64{500, 1000, 2000, 5000, 10000, 30000, 60000, 120000, 300000, 600000,
		1800000, 3600000, 7200000, 21600000, 43200000, 86400000}
	messageBuckets = []float64{100, 1000, 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000}
)

// waitBuckets span 1 ms to ~17 min, for sluice's own waits.
var waitBuckets = prometheus.ExponentialBuckets(1, 2.5, 16)

// Metrics holds every collector. Build it once with New and derive a
// per-queue view with For.
type Metrics struct {
	// Upstream's names and meanings.
	Requests            *prometheus.CounterVec
	Retries             *prometheus.CounterVec
	Succeeded           *prometheus.CounterVec
	Failed              *prometheus.CounterVec
	Expired             *prometheus.CounterVec
	Shedded             *prometheus.CounterVec
	GateDecisions       *prometheus.CounterVec
	InferenceMs         *prometheus.HistogramVec
	ResidenceMs         *prometheus.HistogramVec
	MessageMs           *prometheus.HistogramVec
	QueueDepth          *prometheus.GaugeVec
	Inflight            *prometheus.GaugeVec
	BrokerBacklog       *prometheus.GaugeVec
	DispatchBudget      *prometheus.GaugeVec
	PoolWorkerLimit     *prometheus.GaugeVec
	GateMetricValue     *prometheus.GaugeVec
	GateMetricThreshold *prometheus.GaugeVec
	GateMetricAvailable *prometheus.GaugeVec
	// Upstream's, since v0.9.1 (see docs/metrics.md).
	Tokens             *prometheus.CounterVec
	Dispatched         *prometheus.CounterVec
	BacklogAvailable   *prometheus.GaugeVec
	QueueConfigReloads *prometheus.CounterVec
	// QueueConfigLastSuccess is when the queue file was last reloaded
	// successfully, in Unix seconds (0 until the first reload).
	QueueConfigLastSuccess prometheus.Gauge
	GateWaitRequeues       *prometheus.CounterVec
	GateWaiting            *prometheus.GaugeVec
	// DeadlineProximity is the custom histogram of the requests waiting in
	// the broker by time left before their deadline.
	DeadlineProximity *ProximityCollector

	// sluice's own.
	Results        *prometheus.CounterVec
	DeadLettered   *prometheus.CounterVec
	HandedBack     *prometheus.CounterVec
	Deferred       *prometheus.CounterVec
	Evicted        *prometheus.CounterVec
	Resumed        *prometheus.CounterVec
	GateVerdicts   *prometheus.CounterVec
	GatewayDropped *prometheus.CounterVec
	WaitMs         *prometheus.HistogramVec
	Claimed        *prometheus.GaugeVec
	Delayed        *prometheus.GaugeVec
	InflightMax    *prometheus.GaugeVec
	CreditLimit    *prometheus.GaugeVec
	GateBudget     *prometheus.GaugeVec
	GateFailures   *prometheus.CounterVec
	GateFailing    *prometheus.GaugeVec
	// EvictSuspended is 1 while a queue's eviction is suspended because its
	// gate saw the pool not free the calls taken back (label queue: the
	// queue's id).
	EvictSuspended *prometheus.GaugeVec

	// ResultWriteErrors counts failed attempts to write a result.
	ResultWriteErrors *prometheus.CounterVec
}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	cv := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(append([]string{}, queueLabels...), extra...))
	}
	gv := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	qgv := func(name, help string, extra ...string) *prometheus.GaugeVec {
		return gv(name, help, append(append([]string{}, queueLabels...), extra...)...)
	}
	hv := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, queueLabels)
	}
	m := &Metrics{
		Requests:            cv(Upstream+"request_total", "Requests picked up on their first attempt (retry_count 0); redeliveries of a first attempt (a deferral, a hand-back) count again."),
		Retries:             cv(Upstream+"request_retries_total", "Retries scheduled after a retryable failure (429, 5xx, transport errors) with time left before the deadline."),
		Succeeded:           cv(Upstream+"successful_requests_total", "Requests whose final gateway response had a status below 400."),
		Failed:              cv(Upstream+"failed_requests_total", "Requests that failed for good: a final 4xx other than 429, retries given up, no usable response, an invalid request."),
		Expired:             cv(Upstream+"exceeded_deadline_requests_total", "Requests that ended because their deadline passed (before dispatch, during it, or with no time left to retry)."),
		Shedded:             cv(Upstream+"shedded_requests_total", "Gateway attempts answered 429, once per attempt (a request retried after a 429 may still succeed)."),
		GateDecisions:       cv(Upstream+"gate_decisions_total", "Gate decisions that kept requests from dispatch, by reason (gate_closed, quota_exhausted, dropped, error).", "reason"),
		InferenceMs:         hv(Upstream+"inference_latency_time_millis", "Duration of each HTTP attempt to the gateway, in whole milliseconds.", inferenceBuckets),
		ResidenceMs:         hv(Upstream+"queue_residence_time_millis", "Time a claimed request waited inside sluice before a handler picked it up, in milliseconds.", residenceBuckets),
		MessageMs:           hv(Upstream+"message_latency_time_millis", "Time from the request's creation to its result, in milliseconds (every transport; upstream: gcp only).", messageBuckets),
		QueueDepth:          qgv(Upstream+"queue_depth", "Requests claimed from the broker and waiting inside sluice for a handler (sampled)."),
		Inflight:            qgv(Upstream+"inflight_requests", "Requests past the gate and the cancellation check whose gateway call is under way."),
		BrokerBacklog:       qgv(Upstream+"broker_backlog", "Requests waiting in the broker, claimable now (sampled; delayed retries are in sluice_delayed_requests)."),
		DispatchBudget:      qgv(Upstream+"dispatch_budget", "The gate budget in force for the queue, in [0,1]."),
		PoolWorkerLimit:     gv(Upstream+"pool_worker_limit", "The most requests the worker pool's queues may have in flight at once (their max concurrency, summed).", "pool_name"),
		GateMetricValue:     qgv(Upstream+"gate_metric_value", "The reading a metric gate compares with its threshold (for prometheus-saturation, 1 − saturation).", "inference_pool"),
		GateMetricThreshold: qgv(Upstream+"gate_metric_threshold", "The threshold a metric gate compares its reading with (for prometheus-saturation, 1 − threshold).", "inference_pool"),
		GateMetricAvailable: qgv(Upstream+"gate_metric_source_available", "1 when a metric gate's last reading was usable, 0 when it fell back.", "inference_pool"),

		Results:        cv("sluice_results_total", "Results written (once, when the write succeeded), by code: ok, http_error (a final answer ≥ 400) or the error code.", "code"),
		DeadLettered:   cv("sluice_dead_lettered_total", "Messages without a readable id, sent to the dead-letter destination."),
		HandedBack:     cv("sluice_handed_back_total", "Deliveries handed back to the transport unfinished (shutdown; a result that could not be written, kept in the message)."),
		Deferred:       cv("sluice_deferred_total", "Requests a gate deferred (re-queued without counting an attempt)."),
		Evicted:        cv("sluice_evicted_total", "Gateway calls aborted because the queue's gate budget fell below what it had in flight (queue option evict); their requests were re-queued without counting an attempt."),
		Resumed:        cv("sluice_resumed_tokens_total", "Completion tokens of evicted calls kept for the request's next attempt (queue option resume) instead of being made again."),
		GateVerdicts:   cv("sluice_gate_verdicts_total", "Per-request gate verdicts, admissions included (admit, defer, reject, wait, error).", "verdict"),
		GatewayDropped: cv("sluice_gateway_dropped_total", "Gateway responses that carried x-llm-d-request-dropped-reason."),
		WaitMs:         hv("sluice_dispatch_wait_millis", "Time from the request's creation to the start of its last dispatch, in milliseconds.", waitBuckets),
		Claimed:        qgv("sluice_claimed_requests", "Requests claimed from the broker and not yet settled (sampled)."),
		Delayed:        qgv("sluice_delayed_requests", "Requests waiting in the broker for a later time: retries and deferrals (sampled)."),
		InflightMax:    qgv("sluice_inflight_limit_max", "The queue's in-flight limit at budget 1 (max concurrency)."),
		CreditLimit:    qgv("sluice_inflight_limit", "The queue's current in-flight limit: ceil(max × budget), ramped."),
		GateBudget:     gv("sluice_gate_budget", "The budget each gate last reported, after its failure policy.", "gate"),
		GateFailures:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gate_failures_total", Help: "Failed gate budget queries."}, []string{"gate"}),
		GateFailing:    gv("sluice_gate_failing", "1 while a gate's budget queries fail (its failure policy is in force).", "gate"),
		EvictSuspended: gv("sluice_evict_suspended", "1 while the queue's eviction (queue option evict) is suspended: its gate saw the pool not free the calls taken back; it tries again after a back-off.", "queue"),
	}
	m.Tokens = cv(Upstream+"tokens_total", "Tokens the gateway reported in the usage object of 2xx JSON responses, by direction (input: prompt_tokens, output: completion_tokens).", "direction")
	m.Dispatched = cv(Upstream+"dispatched_requests_total", "Attempts sent to the gateway, retries included.")
	m.BacklogAvailable = qgv(Upstream+"broker_backlog_source_available", "1 when the last read of the queue's broker backlog succeeded, 0 when it failed.")
	m.QueueConfigReloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: Upstream + "queue_config_reloads_total",
		Help: "Reloads of the queue configuration file, by result (success, error)."}, []string{"result"})
	m.GateWaitRequeues = cv(Upstream+"gate_wait_requeues_total", "Requests re-queued because they waited on a pool gate's Wait verdict for --gate-wait-timeout.")
	m.GateWaiting = qgv(Upstream+"gate_waiting_requests", "Requests waiting on a pool gate's Wait verdict now.")
	m.DeadlineProximity = newProximityCollector()
	m.QueueConfigLastSuccess = prometheus.NewGauge(prometheus.GaugeOpts{Name: Upstream + "queue_config_last_success_timestamp_seconds",
		Help: "When the queue configuration file was last reloaded successfully, in Unix seconds (0: not yet)."})
	for _, r := range ReloadResults {
		m.QueueConfigReloads.WithLabelValues(r) // created at 0: no reload yet
	}
	m.ResultWriteErrors = cv("sluice_result_write_errors_total", "Failed attempts to write a result (retried with a backoff; the request is not dispatched again).")
	for _, c := range []prometheus.Collector{
		m.Requests, m.Retries, m.Succeeded, m.Failed, m.Expired, m.Shedded, m.GateDecisions,
		m.InferenceMs, m.ResidenceMs, m.MessageMs, m.QueueDepth, m.Inflight, m.BrokerBacklog, m.DispatchBudget,
		m.PoolWorkerLimit, m.GateMetricValue, m.GateMetricThreshold, m.GateMetricAvailable,
		m.Results, m.DeadLettered, m.HandedBack, m.Deferred, m.Evicted, m.Resumed, m.GateVerdicts, m.GatewayDropped, m.WaitMs,
		m.Claimed, m.Delayed, m.InflightMax, m.CreditLimit, m.GateBudget, m.GateFailures, m.GateFailing,
		m.EvictSuspended, m.ResultWriteErrors,
		m.Tokens, m.Dispatched, m.BacklogAvailable, m.QueueConfigReloads, m.QueueConfigLastSuccess, m.GateWaitRequeues, m.GateWaiting,
		m.DeadlineProximity,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Queue is the view of one label set: every per-queue collector bound to
// its labels, so the per-message path does no label lookups.
type Queue struct {
	Labels Labels

	Requests, Retries, Succeeded, Failed, Expired, Shedded prometheus.Counter
	DeadLettered, HandedBack, Deferred, GatewayDropped     prometheus.Counter
	Evicted                                                prometheus.Counter
	Resumed                                                prometheus.Counter
	InferenceMs, ResidenceMs, MessageMs, WaitMs            prometheus.Observer
	QueueDepth, Inflight, BrokerBacklog, DispatchBudget    prometheus.Gauge
	Claimed, Delayed, InflightMax, CreditLimit             prometheus.Gauge

	ResultWriteErrors prometheus.Counter

	TokensIn, TokensOut, Dispatched, GateWaitRequeues prometheus.Counter
	BacklogAvailable, GateWaiting                     prometheus.Gauge

	results   map[string]prometheus.Counter
	decisions map[string]prometheus.Counter
	verdicts  map[string]prometheus.Counter
}

// For returns the view of one label set. It creates every series of the
// set, the four decision reasons included, at zero (as upstream does when a
// queue's loop starts).
func (m *Metrics) For(l Labels) *Queue {
	v := l.values()
	q := &Queue{
		Labels:   l,
		Requests: m.Requests.WithLabelValues(v...), Retries: m.Retries.WithLabelValues(v...),
		Succeeded: m.Succeeded.WithLabelValues(v...), Failed: m.Failed.WithLabelValues(v...),
		Expired: m.Expired.WithLabelValues(v...), Shedded: m.Shedded.WithLabelValues(v...),
		DeadLettered: m.DeadLettered.WithLabelValues(v...), HandedBack: m.HandedBack.WithLabelValues(v...),
		Deferred: m.Deferred.WithLabelValues(v...), Evicted: m.Evicted.WithLabelValues(v...), Resumed: m.Resumed.WithLabelValues(v...), GatewayDropped: m.GatewayDropped.WithLabelValues(v...),
		InferenceMs: m.InferenceMs.WithLabelValues(v...), ResidenceMs: m.ResidenceMs.WithLabelValues(v...),
		MessageMs: m.MessageMs.WithLabelValues(v...), WaitMs: m.WaitMs.WithLabelValues(v...),
		QueueDepth: m.QueueDepth.WithLabelValues(v...), Inflight: m.Inflight.WithLabelValues(v...),
		BrokerBacklog: m.BrokerBacklog.WithLabelValues(v...), DispatchBudget: m.DispatchBudget.WithLabelValues(v...),
		Claimed: m.Claimed.WithLabelValues(v...), Delayed: m.Delayed.WithLabelValues(v...),
		InflightMax: m.InflightMax.WithLabelValues(v...), CreditLimit: m.CreditLimit.WithLabelValues(v...),
		results: map[string]prometheus.Counter{}, decisions: map[string]prometheus.Counter{}, verdicts: map[string]prometheus.Counter{},
	}
	q.ResultWriteErrors = m.ResultWriteErrors.WithLabelValues(v...)
	q.TokensIn, q.TokensOut = m.Tokens.WithLabelValues(l.values("input")...), m.Tokens.WithLabelValues(l.values("output")...)
	q.Dispatched, q.GateWaitRequeues = m.Dispatched.WithLabelValues(v...), m.GateWaitRequeues.WithLabelValues(v...)
	q.BacklogAvailable, q.GateWaiting = m.BacklogAvailable.WithLabelValues(v...), m.GateWaiting.WithLabelValues(v...)
	for _, c := range ResultCodes {
		q.results[c] = m.Results.WithLabelValues(l.values(c)...)
	}
	for _, r := range DecisionReasons {
		q.decisions[r] = m.GateDecisions.WithLabelValues(l.values(r)...)
	}
	for _, r := range Verdicts {
		q.verdicts[r] = m.GateVerdicts.WithLabelValues(l.values(r)...)
	}
	return q
}

// RemoveQueueSnapshots deletes the sampled series of queue l: the gauges
// that describe the queue now (backlog and its availability, budget,
// depth, claimed, delayed, in-flight limits, eviction suspended) and its deadline-proximity
// histogram, as upstream's RemoveQueueSnapshots does when a reload removes
// a queue. Counters and latency histograms are kept.
func (m *Metrics) RemoveQueueSnapshots(l Labels) {
	v := l.values()
	for _, g := range []*prometheus.GaugeVec{m.BrokerBacklog, m.BacklogAvailable, m.DispatchBudget, m.QueueDepth,
		m.Inflight, m.Claimed, m.Delayed, m.InflightMax, m.CreditLimit, m.GateWaiting} {
		g.DeleteLabelValues(v...)
	}
	m.EvictSuspended.DeleteLabelValues(l.QueueID)
	m.DeadlineProximity.Delete(l)
}

// Result returns the results counter of one code (see ResultCodes).
func (q *Queue) Result(code string) prometheus.Counter {
	if c, ok := q.results[code]; ok {
		return c
	}
	return q.results["INFERENCE_ERROR"]
}

// Decision returns the gate-decisions counter of one reason (see
// DecisionReasons).
func (q *Queue) Decision(reason string) prometheus.Counter {
	if c, ok := q.decisions[reason]; ok {
		return c
	}
	return q.decisions[ReasonError]
}

// Verdict returns sluice's gate-verdicts counter of one verdict.
func (q *Queue) Verdict(verdict string) prometheus.Counter {
	if c, ok := q.verdicts[verdict]; ok {
		return c
	}
	return q.verdicts["error"]
}

// Millis is d in whole milliseconds, as upstream records its histograms.
func Millis(d time.Duration) float64 { return float64(d.Milliseconds()) }
