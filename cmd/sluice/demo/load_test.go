package demo

import (
	"context"
	"testing"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/wire"
)

type okDispatcher struct{}

func (okDispatcher) DoWith(context.Context, dispatch.Target, *wire.Request, dispatch.Overrides) dispatch.Outcome {
	return dispatch.Outcome{Class: dispatch.Success, StatusCode: 200, Body: []byte(`{"ok":true}`)}
}

// BenchmarkPipelineOverhead is the framework's cost per message on the
// memory transport with a dispatcher that answers at once (no HTTP).
func BenchmarkPipelineOverhead(b *testing.B) {
	b.ReportAllocs()
	r, err := MemoryLoad(context.Background(), LoadOptions{Requests: max(b.N, 1000), Dispatcher: okDispatcher{}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.PerSecond, "msgs/s")
	b.ReportMetric(r.AllocsPerMsg, "allocs/msg")
}
