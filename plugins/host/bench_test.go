package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// BenchmarkBudget measures one Budget round trip to the plugin process
// (the example plugin reads its file on every query).
func BenchmarkBudget(b *testing.B) {
	g := newGate(b, map[string]string{"file": budgetFile(b, "1")})
	ctx := context.Background()
	if _, err := g.Budget(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Budget(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmit measures one per-request Admit round trip, serial and
// from parallel callers (as the pipeline's handlers call it).
func BenchmarkAdmit(b *testing.B) {
	g := newGate(b, map[string]string{"file": budgetFile(b, "1"), "admit": "true"}).(gate.Admitter)
	req := &wire.Request{ID: "bench", Deadline: time.Now().Add(time.Hour),
		Metadata: map[string]string{"job_id": "j", "tenant": "t"}, Headers: map[string]string{"X-A": "1"}}
	if _, err := g.Admit(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.Admit(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := g.Admit(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
