package pipeline

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// A request is counted under the labels its envelope names when the
// transport labels that way (upstream's sorted set), under the queue's own
// otherwise, and never under more than maxViews label sets per queue.
func TestMetricViews(t *testing.T) {
	all, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sorted := newQueueMetrics(all, transport.MetricLabels{QueueID: "q", QueueName: "rq", QueueIDFromMessage: true, QueueNameFromMessage: true}, "default")
	pubsub := newQueueMetrics(all, transport.MetricLabels{QueueName: "ch", QueueIDFromMessage: true}, "default")
	gcp := newQueueMetrics(all, transport.MetricLabels{QueueName: "sub"}, "p1")
	named := &wire.Request{QueueID: "tenant-q", RequestQueueName: "other-rq"}
	for _, tt := range []struct {
		qm   *queueMetrics
		req  *wire.Request
		want metrics.Labels
	}{
		{sorted, nil, metrics.Labels{QueueID: "q", QueueName: "rq", Pool: "default"}},
		{sorted, &wire.Request{}, metrics.Labels{QueueID: "q", QueueName: "rq", Pool: "default"}},
		{sorted, named, metrics.Labels{QueueID: "tenant-q", QueueName: "other-rq", Pool: "default"}},
		{pubsub, named, metrics.Labels{QueueID: "tenant-q", QueueName: "ch", Pool: "default"}},
		{pubsub, &wire.Request{}, metrics.Labels{QueueName: "ch", Pool: "default"}},
		{gcp, named, metrics.Labels{QueueName: "sub", Pool: "p1"}},
	} {
		if got := tt.qm.of(tt.req).Labels; got != tt.want {
			t.Errorf("%+v: labels %+v, want %+v", tt.req, got, tt.want)
		}
	}
	if sorted.of(named) != sorted.of(&wire.Request{QueueID: "tenant-q", RequestQueueName: "other-rq"}) {
		t.Error("the same labels gave two views")
	}

	// Beyond maxViews distinct label sets, requests count under the queue's own.
	for i := range 2 * maxViews {
		sorted.of(&wire.Request{QueueID: fmt.Sprint("id-", i)})
	}
	if n := sorted.nviews.Load(); n != maxViews {
		t.Errorf("%d views, want %d", n, maxViews)
	}
	if !sorted.overflow.Load() {
		t.Error("overflow not flagged")
	}
	if v := sorted.of(&wire.Request{QueueID: "one-more"}); v != sorted.own {
		t.Errorf("overflowing request counted under %+v", v.Labels)
	}
}
