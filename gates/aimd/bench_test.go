package aimd_test

import (
	"context"
	"testing"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/aimd"
)

// BenchmarkAdmitObserveRelease is the gate's cost per request: one
// admission, its answer (a 2xx) and its release.
func BenchmarkAdmitObserveRelease(b *testing.B) {
	g, err := aimd.New(aimd.Config{InitialWindow: 64, MaxWindow: 64})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	fb := gate.Feedback{StatusCode: 200}
	b.ReportAllocs()
	for b.Loop() {
		d, _ := g.Admit(ctx, batch)
		d.Observe(fb)
		d.Release()
	}
}

// BenchmarkBaselineLocalConcurrency is the same loop's floor: a mutex, a
// counter and a release closure, without windows or feedback.
func BenchmarkBaselineLocalConcurrency(b *testing.B) {
	var n int
	var mu = make(chan struct{}, 1)
	b.ReportAllocs()
	for b.Loop() {
		mu <- struct{}{}
		n++
		<-mu
		release := func() { mu <- struct{}{}; n--; <-mu }
		release()
	}
}
