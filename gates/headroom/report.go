package headroom

import "github.com/sluice-io/sluice/core/gate"

var _ gate.PodReporter = (*Gate)(nil)

// PodReadings implements gate.PodReporter: each pod's part of the last
// reading (the queue's calls there and allowed_i), in the endpoints'
// order; nil with dispatch "gateway" or before the first reading.
func (g *Gate) PodReadings() []gate.PodReading {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pods == nil || len(g.last.Pods) == 0 {
		return nil
	}
	out := make([]gate.PodReading, len(g.last.Pods))
	for i, p := range g.last.Pods {
		out[i] = gate.PodReading{Pod: p.URL, InFlight: p.Own, Limit: p.Allowed, Running: p.Running, Waiting: p.Waiting,
			KV: p.KV, Burst: p.Burst}
	}
	return out
}
