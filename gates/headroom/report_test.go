package headroom_test

import (
	"context"
	"testing"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// With dispatch "pods" the gate reports each pod's part of the last
// reading (the queue's calls there against allowed_i, the pod's gauges)
// for the status page; with dispatch "gateway", and before the first
// reading, it reports none.
func TestPodReadings(t *testing.T) {
	p := newPods(t, 2)
	g, _ := podsGate(t, p, `,"kv_limit":0.9`)
	if r := gate.PodReporterOf(g).PodReadings(); r != nil {
		t.Fatalf("before the first reading: %+v", r)
	}
	ctx := context.Background()
	p.set(0, 10, 1) // pod 0: 10 running, 1 waiting
	p.mu.Lock()
	p.kv[0] = 0.4
	p.mu.Unlock()
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != base(p, 1) {
		t.Fatalf("placed on %q, want pod 1 (pod 0 has a request waiting)", pod)
	}
	p.set(1, 1, 0)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	r := g.PodReadings()
	if len(r) != 2 {
		t.Fatalf("%d pods, want 2: %+v", len(r), r)
	}
	last := g.Last()
	for i, pr := range r {
		lp := last.Pods[i]
		if pr.Pod != base(p, i) || pr.InFlight != lp.Own || pr.Limit != lp.Allowed || pr.Running != lp.Running ||
			pr.Waiting != lp.Waiting || pr.KV != lp.KV || pr.Burst != lp.Burst {
			t.Errorf("pod %d: reported %+v, the reading %+v", i, pr, lp)
		}
	}
	if r[1].InFlight != 1 || r[0].InFlight != 0 || r[0].Running != 10 || r[0].Waiting != 1 || r[0].KV != 0.4 {
		t.Errorf("readings %+v, want pod 1 holding the call, pod 0's gauges 10/1/0.4", r)
	}
	if r[1].Limit != 16-2 {
		t.Errorf("pod 1 limit %d, want 14 (16 seats, reserve 2, its own call not other traffic)", r[1].Limit)
	}

	gw := mustBuild(t, p.params(`,"reserve":2`), 64)
	if _, err := gw.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if r := gw.PodReadings(); r != nil {
		t.Errorf("dispatch gateway reports pods: %+v", r)
	}
}
