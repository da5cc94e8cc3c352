package pipeline

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// The history keeps one sample per historyStep (a faster sampler is
// thinned), forgets what is older than HistorySpan, and the throughput is
// taken over the last RateWindow.
func TestQueueHistory(t *testing.T) {
	var h queueHistory
	t0 := time.Unix(1_700_000_000, 0)
	// A sampler ticking every 500ms for 20 minutes, 10 results a second.
	for i := 0; i <= 2400; i++ {
		at := t0.Add(time.Duration(i) * 500 * time.Millisecond)
		h.sample(at, float64(i%4)/4, uint64(i*5))
	}
	now := t0.Add(20 * time.Minute)
	qs := QueueSnapshot{Total: 2400 * 5}
	h.read(now, &qs)
	if n := len(qs.BudgetHistory); n < 440 || n > historyLen {
		t.Errorf("%d samples over 15 min at one per %v", n, historyStep)
	}
	if first := qs.BudgetHistory[0].At; now.Sub(first) > HistorySpan {
		t.Errorf("oldest sample %v old", now.Sub(first))
	}
	for i := 1; i < len(qs.BudgetHistory); i++ {
		if d := qs.BudgetHistory[i].At.Sub(qs.BudgetHistory[i-1].At); d < historyStep*9/10 {
			t.Fatalf("samples %v apart", d)
		}
	}
	if math.Abs(qs.Throughput-10) > 0.01 {
		t.Errorf("throughput %v, want 10/s", qs.Throughput)
	}
	if !qs.DepthAt.IsZero() {
		t.Error("a depth without a depth read")
	}
	h.observeDepth(now, transport.Depth{Waiting: 7, Delayed: 3})
	h.read(now, &qs)
	if qs.Waiting != 7 || qs.Delayed != 3 || !qs.DepthAt.Equal(now) {
		t.Errorf("depth %d/%d at %v", qs.Waiting, qs.Delayed, qs.DepthAt)
	}

	// A young history: the rate since the first sample.
	var young queueHistory
	young.sample(t0, 1, 0)
	qs = QueueSnapshot{Total: 30}
	young.read(t0.Add(3*time.Second), &qs)
	if math.Abs(qs.Throughput-10) > 0.01 || len(qs.BudgetHistory) != 1 {
		t.Errorf("young history: throughput %v, %d samples", qs.Throughput, len(qs.BudgetHistory))
	}
	// A stale one (the sampler stopped): no rate, no samples.
	qs = QueueSnapshot{Total: 30}
	young.read(t0.Add(time.Hour), &qs)
	if qs.Throughput != 0 || len(qs.BudgetHistory) != 0 {
		t.Errorf("stale history: throughput %v, %d samples", qs.Throughput, len(qs.BudgetHistory))
	}
}

// The results of a queue are summed over its metric views (requests that
// named other labels).
func TestResultTotalCountsViews(t *testing.T) {
	all, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	qm := newQueueMetrics(all, transport.MetricLabels{QueueID: "q", QueueName: "rq", QueueIDFromMessage: true}, "default")
	qm.own.Result("ok").Add(3)
	qm.of(&wire.Request{QueueID: "tenant"}).Result("GATE_DROPPED").Add(2)
	if n := qm.resultTotal(); n != 5 {
		t.Errorf("result total %d, want 5", n)
	}
}
