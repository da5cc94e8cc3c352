package app

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/gate"
)

// gateMetrics is the registerer of one gate's own collectors (gate.Env's
// Metrics and PoolMetrics): it registers them on the deployment's
// registry and remembers them, so that closing the gate unregisters them
// all (a gate dropped by a reload leaves no series; the gate built in its
// place registers its own).
type gateMetrics struct {
	reg prometheus.Registerer

	mu sync.Mutex
	cs []prometheus.Collector
}

// Register implements prometheus.Registerer.
func (g *gateMetrics) Register(c prometheus.Collector) error {
	if err := g.reg.Register(c); err != nil {
		return err
	}
	g.mu.Lock()
	g.cs = append(g.cs, c)
	g.mu.Unlock()
	return nil
}

// MustRegister implements prometheus.Registerer.
func (g *gateMetrics) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := g.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer.
func (g *gateMetrics) Unregister(c prometheus.Collector) bool {
	g.mu.Lock()
	g.cs = slices.DeleteFunc(g.cs, func(x prometheus.Collector) bool { return x == c })
	g.mu.Unlock()
	return g.reg.Unregister(c)
}

// unregisterAll unregisters every collector registered through g.
func (g *gateMetrics) unregisterAll() {
	g.mu.Lock()
	cs := g.cs
	g.cs = nil
	g.mu.Unlock()
	for _, c := range cs {
		g.reg.Unregister(c)
	}
}

// withGateMetrics sets env's Metrics (labelled gate=name) and PoolMetrics
// on a new gateMetrics of reg, which it returns (nil reg: neither is set,
// and the gate exports nothing).
func withGateMetrics(env *gate.Env, reg prometheus.Registerer, name string) *gateMetrics {
	if reg == nil {
		return nil
	}
	gm := &gateMetrics{reg: reg}
	env.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"gate": name}, gm)
	env.PoolMetrics = gm
	return gm
}

// onClose is the refresher's OnClose for gm (nil: nothing to do).
func (g *gateMetrics) onClose() func() {
	if g == nil {
		return nil
	}
	return g.unregisterAll
}
