package pipeline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// How the pipeline feeds upstream's metrics (docs/metrics.md has the table):
//
//   - request_total counts first attempts (retry_count 0) when a handler picks
//     them up; a deferral or hand-back that keeps retry_count 0 counts again,
//     as upstream's redeliveries do.
//   - successful / failed / exceeded_deadline count final outcomes; a request
//     cancelled, dropped by a gate or failed by one is in none of them (it
//     is in sluice_results_total), as upstream.
//   - shedded counts 429 answers, once per attempt.
//   - inference latency is observed per attempt; residence from the claim to
//     the handler; queue_depth is what was claimed and waits for a handler.
//   - gate_decisions counts only what kept a request from dispatch.
//
// Labels follow the transport (transport.MetricLabelsOf); a request whose
// envelope names another queue_id or queue_name is counted under those, as
// upstream does, in a view created on first sight. At most maxViews such
// views exist per queue: beyond that, requests are counted under the
// queue's own labels, so a producer writing random names cannot grow the
// series without bound.

// maxViews bounds the per-message label sets of one queue.
const maxViews = 64

// queueMetrics is a queue's metrics state.
type queueMetrics struct {
	all    *metrics.Metrics
	labels transport.MetricLabels
	pool   string
	own    *metrics.Queue // the queue's own labels

	views    sync.Map // metrics.Labels → *metrics.Queue
	nviews   atomic.Int32
	overflow atomic.Bool // a request was counted under own for lack of room
	warned   bool        // the overflow was logged (sampler goroutine only)

	handling atomic.Int64 // deliveries inside the handler
	history  queueHistory // for Snapshot (status.go)
}

func newQueueMetrics(all *metrics.Metrics, labels transport.MetricLabels, pool string) *queueMetrics {
	qm := &queueMetrics{all: all, labels: labels, pool: pool}
	qm.own = all.For(metrics.Labels{QueueID: labels.QueueID, QueueName: labels.QueueName, Pool: pool})
	return qm
}

// of returns the view req is counted under (the queue's own when req is nil).
func (qm *queueMetrics) of(req *wire.Request) *metrics.Queue {
	if req == nil {
		return qm.own
	}
	l := qm.own.Labels
	if qm.labels.QueueIDFromMessage && req.QueueID != "" {
		l.QueueID = req.QueueID
	}
	if qm.labels.QueueNameFromMessage && req.RequestQueueName != "" {
		l.QueueName = req.RequestQueueName
	}
	if l == qm.own.Labels {
		return qm.own
	}
	if v, ok := qm.views.Load(l); ok {
		return v.(*metrics.Queue)
	}
	if qm.nviews.Add(1) > maxViews {
		qm.nviews.Add(-1)
		qm.overflow.Store(true)
		return qm.own
	}
	v, loaded := qm.views.LoadOrStore(l, qm.all.For(l))
	if loaded {
		qm.nviews.Add(-1)
	}
	return v.(*metrics.Queue)
}

// mq returns the metrics view of d's request (cached on d once decoded).
func (d *delivery) mq() *metrics.Queue {
	if d.view != nil {
		return d.view
	}
	v := d.Queue.metrics.of(d.Req)
	if d.Req != nil {
		d.view = v
	}
	return v
}

// recordMetrics counts every delivery by how it ended and observes latencies.
func recordMetrics(q *Queue) message.HandlerMiddleware {
	qm := q.metrics
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			qm.handling.Add(1)
			defer qm.handling.Add(-1)
			if c := transport.Claimed(m); !c.IsZero() {
				qm.own.ResidenceMs.Observe(metrics.Millis(time.Since(c)))
			}
			out, err := next(m)
			countEnd(deliveryOf(m), err)
			return out, err
		}
	}
}

// countEnd counts how d ended (err: the chain's error, which hands it
// back): handed back, dead-lettered, re-queued, or answered, with its wait
// and message latencies, its result (countResult) and the code its
// written result is counted under.
func countEnd(d *delivery, err error) {
	mq := d.mq()
	if d.Req != nil && d.Req.RetryCount == 0 {
		mq.Requests.Inc()
	}
	if err != nil {
		d.Outcome = outcomeHandedBack
	}
	switch d.Outcome {
	case outcomeHandedBack:
		mq.HandedBack.Inc()
		return
	case outcomeDeadLettered:
		mq.DeadLettered.Inc()
		return
	case outcomeRequeued:
		return
	}
	if d.kept { // answered and counted by an earlier delivery: only the write is left
		d.resultCode = resultCode(d)
		return
	}
	if d.Req != nil && !d.Req.Created.IsZero() {
		now := time.Now()
		if !d.Dispatched.IsZero() {
			mq.WaitMs.Observe(ms(d.Dispatched.Sub(d.Req.Created)))
		}
		mq.MessageMs.Observe(metrics.Millis(now.Sub(d.Req.Created)))
	}
	if d.Result == nil {
		return
	}
	countResult(mq, d.Result, d.DeadlineEnded)
	// sluice_results_total counts the result once it is written (the settler).
	d.resultCode = resultCode(d)
}

// countResult counts res, a request's result, as succeeded, expired or
// failed; deadlineEnded says retries were ended by the deadline, which
// makes the last answer an expiry.
func countResult(mq *metrics.Queue, res *wire.Result, deadlineEnded bool) {
	switch res.ErrorCode {
	case wire.CodeNone:
		switch {
		case res.OK():
			mq.Succeeded.Inc()
		case deadlineEnded: // retries ended by the deadline: the last answer
			mq.Expired.Inc()
		default: // the gateway's final answer, 400 or above
			mq.Failed.Inc()
		}
	case wire.CodeDeadlineExceeded:
		mq.Expired.Inc()
	case wire.CodeInferenceError, wire.CodeInvalidRequest:
		mq.Failed.Inc()
	}
}

// resultCode is the code label of d's result in sluice_results_total.
func resultCode(d *delivery) string {
	if d.Result.ErrorCode != wire.CodeNone {
		return string(d.Result.ErrorCode)
	}
	if d.Result.OK() {
		return "ok"
	}
	return resultHTTPError // the gateway's final answer, 400 or above (or the last one at the deadline)
}

// resultHTTPError is the result label of a request answered with the
// gateway's final response of status 400 or above (no error code).
const resultHTTPError = "http_error"

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sampleQueue sets q's sampled gauges: credits, budget, gate readings and,
// when dr is not nil, the broker's depths; with the depths it counts one
// gate_closed decision while the gate holds the queue shut with requests
// waiting (upstream counts one per poll tick).
func (p *Pipeline) sampleQueue(ctx context.Context, q *Queue, dr transport.DepthReporter) {
	own := q.metrics.own
	inflight, limit, _ := q.credits.Snapshot()
	own.Claimed.Set(float64(inflight))
	own.QueueDepth.Set(float64(max(0, int64(inflight)-q.metrics.handling.Load())))
	own.CreditLimit.Set(float64(limit))
	budget := q.Gate.Budget()
	own.DispatchBudget.Set(budget)
	if dr != nil {
		dctx, cancel := context.WithTimeout(ctx, max(p.cfg.GaugeInterval, time.Second))
		d, err := dr.Depth(dctx, q.Queue)
		cancel()
		if err == nil {
			q.metrics.history.observeDepth(time.Now(), d)
			own.BrokerBacklog.Set(float64(d.Waiting))
			own.Delayed.Set(float64(d.Delayed))
			own.BacklogAvailable.Set(1)
			if budget <= 0 && d.Waiting > 0 {
				own.Decision(metrics.ReasonGateClosed).Inc()
			}
		} else {
			own.BacklogAvailable.Set(0)
		}
		if pr, ok := dr.(transport.DeadlineProximityReporter); ok {
			p.sampleProximity(ctx, q, pr)
		}
	}
	q.metrics.history.sample(time.Now(), budget, q.metrics.resultTotal())
	l := own.Labels
	for _, r := range gate.ReadingsOf(q.Gate.Gate()) {
		lv := []string{l.QueueID, l.QueueName, l.Pool, r.Pool}
		if r.Read {
			q.metrics.all.GateMetricValue.WithLabelValues(lv...).Set(r.Value)
			q.metrics.all.GateMetricThreshold.WithLabelValues(lv...).Set(r.Threshold)
		}
		avail := 0.0
		if r.Available {
			avail = 1
		}
		q.metrics.all.GateMetricAvailable.WithLabelValues(lv...).Set(avail)
	}
	if !q.metrics.warned && q.metrics.overflow.Load() {
		q.metrics.warned = true
		p.log.Warn("requests name more queue ids or names than the metrics keep per queue; the excess is counted under the queue's own labels",
			"queue", q.ID, "kept", maxViews)
	}
}

// sampleProximity records q's deadline proximity snapshot; on a failed read
// every bucket reads 0, as upstream.
func (p *Pipeline) sampleProximity(ctx context.Context, q *Queue, pr transport.DeadlineProximityReporter) {
	dctx, cancel := context.WithTimeout(ctx, max(p.cfg.GaugeInterval, time.Second))
	cum, total, err := pr.DeadlineProximity(dctx, q.Queue, metrics.ProximityBounds)
	cancel()
	if err != nil {
		cum, total = make([]uint64, len(metrics.ProximityBounds)), 0
	}
	p.cfg.Metrics.DeadlineProximity.Set(q.metrics.own.Labels, metrics.Proximity{Cumulative: cum, Total: total})
}
