// Package metrics defines sluice's Prometheus metrics. The names under the
// llm_d_async_async_ prefix are upstream's (dashboards rely on them); the
// sluice_ ones are additions. Every metric is registered on the registry the
// caller passes: there is no global state.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Upstream is the prefix of the metrics kept compatible with llm-d-async.
const Upstream = "llm_d_async_async_"

// queueLabels are upstream's per-queue labels.
var queueLabels = []string{"queue_id", "queue_name", "pool_name"}

// Metrics holds every collector. Build it once with New and derive a
// per-queue view with For.
type Metrics struct {
	Requests       *prometheus.CounterVec
	Retries        *prometheus.CounterVec
	Succeeded      *prometheus.CounterVec
	Failed         *prometheus.CounterVec
	Expired        *prometheus.CounterVec
	Shedded        *prometheus.CounterVec
	GateDecisions  *prometheus.CounterVec
	InferenceMs    *prometheus.HistogramVec
	ResidenceMs    *prometheus.HistogramVec
	MessageMs      *prometheus.HistogramVec
	QueueDepth     *prometheus.GaugeVec
	Inflight       *prometheus.GaugeVec
	BrokerBacklog  *prometheus.GaugeVec
	DispatchBudget *prometheus.GaugeVec

	Results      *prometheus.CounterVec
	DeadLettered *prometheus.CounterVec
	HandedBack   *prometheus.CounterVec
	Deferred     *prometheus.CounterVec
	InflightMax  *prometheus.GaugeVec
	CreditLimit  *prometheus.GaugeVec
	GateBudget   *prometheus.GaugeVec
	GateFailures *prometheus.CounterVec
	GateFailing  *prometheus.GaugeVec
}

// msBuckets spans 1 ms to ~17 min, for latencies of LLM calls and queue waits.
var msBuckets = prometheus.ExponentialBuckets(1, 2.5, 16)

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	cv := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(append([]string{}, queueLabels...), extra...))
	}
	gv := func(name, help string, labels []string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	hv := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: msBuckets}, queueLabels)
	}
	m := &Metrics{
		Requests:       cv(Upstream+"request_total", "Requests taken from the queue (each delivery, retries included)."),
		Retries:        cv(Upstream+"request_retries_total", "Requests re-queued after a retryable failure."),
		Succeeded:      cv(Upstream+"successful_requests_total", "Requests that ended with a 2xx gateway response."),
		Failed:         cv(Upstream+"failed_requests_total", "Requests that ended with an error result other than DEADLINE_EXCEEDED."),
		Expired:        cv(Upstream+"exceeded_deadline_requests_total", "Requests that ended with DEADLINE_EXCEEDED."),
		Shedded:        cv(Upstream+"shedded_requests_total", "Requests a gate dropped (GATE_DROPPED) or the gateway shed (x-llm-d-request-dropped-reason)."),
		GateDecisions:  cv(Upstream+"gate_decisions_total", "Per-request gate decisions, by reason (admit, defer, reject, error).", "reason"),
		InferenceMs:    hv(Upstream+"inference_latency_time_millis", "Duration of the HTTP call to the gateway, in milliseconds."),
		ResidenceMs:    hv(Upstream+"queue_residence_time_millis", "Time from the request's creation to its dispatch, in milliseconds."),
		MessageMs:      hv(Upstream+"message_latency_time_millis", "Time from the request's creation to its result, in milliseconds."),
		QueueDepth:     gv(Upstream+"queue_depth", "Requests waiting in the queue (sampled).", queueLabels),
		Inflight:       gv(Upstream+"inflight_requests", "Requests claimed and not yet settled.", queueLabels),
		BrokerBacklog:  gv(Upstream+"broker_backlog", "Requests held by the broker but not claimable now: delayed retries (sampled).", queueLabels),
		DispatchBudget: gv(Upstream+"dispatch_budget", "The gate budget in force for the queue, in [0,1].", queueLabels),

		Results:      cv("sluice_results_total", "Results written, by error code (ok for success).", "code"),
		DeadLettered: cv("sluice_dead_lettered_total", "Messages without a readable id, sent to the dead-letter destination."),
		HandedBack:   cv("sluice_handed_back_total", "Deliveries handed back to the transport unfinished (shutdown, result write failure)."),
		Deferred:     cv("sluice_deferred_total", "Requests a gate deferred (re-queued without counting an attempt)."),
		InflightMax:  gv("sluice_inflight_limit_max", "The queue's in-flight limit at budget 1 (max concurrency).", queueLabels),
		CreditLimit:  gv("sluice_inflight_limit", "The queue's current in-flight limit: ceil(max × budget), ramped.", queueLabels),
		GateBudget:   gv("sluice_gate_budget", "The budget each gate last reported, after its failure policy.", []string{"gate"}),
		GateFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gate_failures_total", Help: "Failed gate budget queries."}, []string{"gate"}),
		GateFailing:  gv("sluice_gate_failing", "1 while a gate's budget queries fail (its failure policy is in force).", []string{"gate"}),
	}
	for _, c := range []prometheus.Collector{
		m.Requests, m.Retries, m.Succeeded, m.Failed, m.Expired, m.Shedded, m.GateDecisions,
		m.InferenceMs, m.ResidenceMs, m.MessageMs, m.QueueDepth, m.Inflight, m.BrokerBacklog, m.DispatchBudget,
		m.Results, m.DeadLettered, m.HandedBack, m.Deferred, m.InflightMax, m.CreditLimit, m.GateBudget, m.GateFailures, m.GateFailing,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Queue is the per-queue view: every collector bound to one queue's labels,
// so the per-message path does no label lookups.
type Queue struct {
	Requests, Retries, Succeeded, Failed, Expired, Shedded prometheus.Counter
	DeadLettered, HandedBack, Deferred                     prometheus.Counter
	InferenceMs, ResidenceMs, MessageMs                    prometheus.Observer
	QueueDepth, Inflight, BrokerBacklog, DispatchBudget    prometheus.Gauge
	InflightMax, CreditLimit                               prometheus.Gauge

	results   map[string]prometheus.Counter
	decisions map[string]prometheus.Counter
}

// ResultCodes are the values of the code label of sluice_results_total.
var ResultCodes = []string{"ok", "DEADLINE_EXCEEDED", "CANCELLED", "GATE_DROPPED", "GATE_ERROR", "INFERENCE_ERROR", "INVALID_REQUEST"}

// DecisionReasons are the values of the reason label of gate_decisions_total.
var DecisionReasons = []string{"admit", "defer", "reject", "error"}

// For returns the view of one queue.
func (m *Metrics) For(queueID, queueName, pool string) *Queue {
	l := []string{queueID, queueName, pool}
	q := &Queue{
		Requests: m.Requests.WithLabelValues(l...), Retries: m.Retries.WithLabelValues(l...),
		Succeeded: m.Succeeded.WithLabelValues(l...), Failed: m.Failed.WithLabelValues(l...),
		Expired: m.Expired.WithLabelValues(l...), Shedded: m.Shedded.WithLabelValues(l...),
		DeadLettered: m.DeadLettered.WithLabelValues(l...), HandedBack: m.HandedBack.WithLabelValues(l...),
		Deferred:    m.Deferred.WithLabelValues(l...),
		InferenceMs: m.InferenceMs.WithLabelValues(l...), ResidenceMs: m.ResidenceMs.WithLabelValues(l...),
		MessageMs:  m.MessageMs.WithLabelValues(l...),
		QueueDepth: m.QueueDepth.WithLabelValues(l...), Inflight: m.Inflight.WithLabelValues(l...),
		BrokerBacklog: m.BrokerBacklog.WithLabelValues(l...), DispatchBudget: m.DispatchBudget.WithLabelValues(l...),
		InflightMax: m.InflightMax.WithLabelValues(l...), CreditLimit: m.CreditLimit.WithLabelValues(l...),
		results: map[string]prometheus.Counter{}, decisions: map[string]prometheus.Counter{},
	}
	for _, c := range ResultCodes {
		q.results[c] = m.Results.WithLabelValues(queueID, queueName, pool, c)
	}
	for _, r := range DecisionReasons {
		q.decisions[r] = m.GateDecisions.WithLabelValues(queueID, queueName, pool, r)
	}
	return q
}

// Result returns the results counter of one error code ("ok" for success).
func (q *Queue) Result(code string) prometheus.Counter {
	if c, ok := q.results[code]; ok {
		return c
	}
	return q.results["INFERENCE_ERROR"]
}

// Decision returns the gate-decisions counter of one reason.
func (q *Queue) Decision(reason string) prometheus.Counter {
	if c, ok := q.decisions[reason]; ok {
		return c
	}
	return q.decisions["error"]
}
