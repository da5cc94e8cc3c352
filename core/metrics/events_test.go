package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestEventsCollector(t *testing.T) {
	n := int64(0)
	c := NewEventsCollector("redis-sortedset", func() map[string]int64 {
		n++
		return map[string]int64{"late_results": n, "reclaimed": 7}
	})
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP sluice_transport_events_total Events a transport counted: late results discarded, requests nobody heard, leases reclaimed, ...
# TYPE sluice_transport_events_total counter
sluice_transport_events_total{event="late_results",transport="redis-sortedset"} 1
sluice_transport_events_total{event="reclaimed",transport="redis-sortedset"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_transport_events_total"); err != nil {
		t.Fatal(err)
	}
	// Read again at the next scrape.
	if got := testutil.CollectAndCount(c); got != 2 {
		t.Fatalf("%d series", got)
	}
}

func TestNewRegistersUpstreamNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	q := m.For(Labels{QueueID: "q", QueueName: "llm-d-async:requests:p", Pool: "default"})
	q.Requests.Inc()
	q.Result("ok").Inc()
	q.Decision(ReasonDropped).Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"llm_d_async_async_request_total", "sluice_results_total", "llm_d_async_async_gate_decisions_total"} {
		if !names[n] {
			t.Errorf("%s not exported", n)
		}
	}
	if _, err := New(reg); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
}
