package app

import (
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/memory"
)

// With tracing on, each request gets a span, child of the producer's
// traceparent, and the gateway receives the span's context.
func TestTracing(t *testing.T) {
	gw, url := newGateway(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(t.Context()) }()

	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url}}},
	}
	h := startAppWith(t, cfg, Options{Transport: mem, TracerProvider: tp})
	const producerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	b := []byte(`{"id":"traced","deadline":4102444800,"payload":{"id":"traced"},
	  "headers":{"Traceparent":"00-` + producerTrace + `-00f067aa0ba902b7-01"}}`)
	if err := h.mem.Enqueue(e2eQueue, b); err != nil {
		t.Fatal(err)
	}
	res := h.waitResults(1, 10*time.Second)
	if r := res["traced"]; r.ErrorCode != wire.CodeNone {
		t.Fatalf("result %+v", r)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if got := s.SpanContext.TraceID().String(); got != producerTrace {
		t.Errorf("span trace %s, want the producer's %s", got, producerTrace)
	}
	if s.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("span parent %s", s.Parent.SpanID())
	}
	sent := gw.headers["traced"].Get("traceparent")
	if !strings.HasPrefix(sent, "00-"+producerTrace+"-"+s.SpanContext.SpanID().String()) {
		t.Errorf("gateway got traceparent %q, want the span's context (span %s)", sent, s.SpanContext.SpanID())
	}
	if len(gw.headers["traced"].Values("traceparent")) != 1 {
		t.Errorf("traceparent sent %d times", len(gw.headers["traced"].Values("traceparent")))
	}
}
