package gate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice/core/gate"
)

// Register: nil registers nothing; series another gate of the same name
// already exports are skipped; any other registration error is returned.
func TestRegister(t *testing.T) {
	events := func() map[string]int64 { return map[string]int64{"x": 1} }
	if err := gate.Register(nil, gate.EventsCollector(events)); err != nil {
		t.Fatalf("nil registerer: %v", err)
	}
	reg := prometheus.NewRegistry()
	named := func(name string) prometheus.Registerer {
		return prometheus.WrapRegistererWith(prometheus.Labels{"gate": name}, reg)
	}
	if err := gate.Register(named("a"), gate.EventsCollector(events)); err != nil {
		t.Fatal(err)
	}
	if err := gate.Register(named("b"), gate.EventsCollector(events)); err != nil {
		t.Fatalf("a second gate of the type: %v", err)
	}
	if err := gate.Register(named("a"), gate.EventsCollector(events)); err != nil {
		t.Fatalf("the same series again (a composite's second inner gate): %v", err)
	}
	if n := testutil.CollectAndCount(reg, "sluice_gate_events_total"); n != 2 {
		t.Fatalf("%d series, want one per gate (2)", n)
	}
	clash := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_gate_events_total", Help: "another help"})
	if err := gate.Register(reg, clash); err == nil || !strings.Contains(err.Error(), "sluice_gate_events_total") {
		t.Fatalf("an inconsistent collector: %v, want an error", err)
	}
}

// OnClose runs once, after the gate was closed, however often Close is
// called.
func TestRefresherOnClose(t *testing.T) {
	g := &closeCounter{}
	calls := 0
	r := gate.NewRefresher(g, gate.RefresherConfig{Name: "t", OnClose: func() {
		if g.closed == 0 {
			t.Error("OnClose ran before the gate was closed")
		}
		calls++
	}})
	for range 2 {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("OnClose ran %d times, want 1", calls)
	}
}

// closeCounter is a gate of budget 1 that counts its closes.
type closeCounter struct{ closed int }

func (g *closeCounter) Budget(context.Context) (float64, error) { return 1, nil }
func (g *closeCounter) Close() error                            { g.closed++; return nil }
