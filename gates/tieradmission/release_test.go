package tieradmission_test

import (
	"testing"

	"github.com/sluice-io/sluice/core/gate"
)

// TestAdmitWithoutInnerReservation: with a budget-only saturation gate
// (upstream's usual prometheus-* inner gate) an admission reserves nothing,
// and its Release, if any, must be safe to call: the pipeline calls it when
// the request ends. (It was sync.OnceFunc(nil), so every request the gate
// admitted panicked after its dispatch and ended as INFERENCE_ERROR.)
func TestAdmitWithoutInnerReservation(t *testing.T) {
	f := newFixture(t)
	open := f.mustBuild(t, `{"saturation_gate":"constant","saturation_gate_params":{"budget":0.3}}`)
	d, err := admit(t, open, request("classification", "reserved", "tier", "batch"))
	if err != nil || d.Verdict != gate.Admit {
		t.Fatalf("open: %+v, %v; want admit", d, err)
	}
	if d.Release != nil {
		d.Release() // panicked: a release wrapping a nil func
		d.Release()
	}
}
