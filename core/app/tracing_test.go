package app

import (
	"context"
	"fmt"
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

// With tracing on, each request gets a "process-request" span, child of the
// producer's trace context (from its metadata, as upstream reads it, or its
// headers), and an "http-request" span whose context the gateway receives.
func TestTracing(t *testing.T) {
	// model: the payload's top-level model is used when the request has
	// none of its own; the request's model field wins over it.
	for _, tc := range []struct{ name, where, model string }{
		{"metadata", `"metadata":{"traceparent":"00-%s-00f067aa0ba902b7-01"}`, "payload-model"},
		{"headers", `"model":"field-model","headers":{"Traceparent":"00-%s-00f067aa0ba902b7-01"}`, "field-model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			b := []byte(`{"id":"traced","deadline":4102444800,"payload":{"id":"traced","model":"payload-model"},` + fmt.Sprintf(tc.where, producerTrace) + `}`)
			if err := h.mem.Enqueue(e2eQueue, b); err != nil {
				t.Fatal(err)
			}
			res := h.waitResults(1, 10*time.Second)
			if r := res["traced"]; r.ErrorCode != wire.CodeNone {
				t.Fatalf("result %+v", r)
			}
			byName := map[string]tracetest.SpanStub{}
			for _, s := range exp.GetSpans() {
				byName[s.Name] = s
			}
			proc, ok1 := byName["process-request"]
			call, ok2 := byName["http-request"]
			if !ok1 || !ok2 || len(byName) != 2 {
				t.Fatalf("spans %v, want process-request and http-request", keys(byName))
			}
			if got := proc.SpanContext.TraceID().String(); got != producerTrace {
				t.Errorf("span trace %s, want the producer's %s", got, producerTrace)
			}
			if proc.Parent.SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("process-request parent %s", proc.Parent.SpanID())
			}
			if call.Parent.SpanID() != proc.SpanContext.SpanID() {
				t.Errorf("http-request parent %s, want process-request %s", call.Parent.SpanID(), proc.SpanContext.SpanID())
			}
			attrs := map[string]string{}
			for _, a := range proc.Attributes {
				attrs[string(a.Key)] = a.Value.String()
			}
			for k, want := range map[string]string{"request.id": "traced", "retry.count": "0", "queue.id": e2eQueue, "queue.name": e2eQueue,
				"gen_ai.request.id": "traced", "llm_d.async.retry_count": "0", "llm_d.async.queue.id": e2eQueue,
				"llm_d.async.queue.name": e2eQueue, "gen_ai.request.model": tc.model} {
				if attrs[k] != want {
					t.Errorf("attribute %s = %q, want %q", k, attrs[k], want)
				}
			}
			sent := gw.headers["traced"].Get("traceparent")
			if !strings.HasPrefix(sent, "00-"+producerTrace+"-"+call.SpanContext.SpanID().String()) {
				t.Errorf("gateway got traceparent %q, want the http-request span's context (span %s)", sent, call.SpanContext.SpanID())
			}
			if len(gw.headers["traced"].Values("traceparent")) != 1 {
				t.Errorf("traceparent sent %d times", len(gw.headers["traced"].Values("traceparent")))
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Tracing is on with sluice's otlp_endpoint or, as upstream, with
// OTEL_EXPORTER_OTLP_ENDPOINT alone; gRPC unless the protocol variable says
// http/protobuf (sluice's own endpoint keeps meaning OTLP/HTTP).
func TestTracingFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		cfgEndpoint, env, prot string
		on                     bool
		protocol               string
	}{
		{"off", "", "", "", false, ""},
		{"env endpoint", "", "http://collector:4317", "", true, "grpc"},
		{"env endpoint, http", "", "http://collector:4318", "http/protobuf", true, "http/protobuf"},
		{"sluice endpoint", "http://collector:4318", "", "", true, "http/protobuf"},
		{"sluice endpoint, grpc", "http://collector:4317", "", "grpc", true, "grpc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.env)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.prot)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
			t.Setenv("OTEL_SERVICE_NAME", "llm-d-async")
			c := config.Tracing{OTLPEndpoint: tc.cfgEndpoint, SampleRatio: 1, ServiceName: "sluice"}
			if got := tracingEnabled(c); got != tc.on {
				t.Fatalf("enabled = %v, want %v", got, tc.on)
			}
			if !tc.on {
				return
			}
			if got := tracingProtocol(c); got != tc.protocol {
				t.Fatalf("protocol = %q, want %q", got, tc.protocol)
			}
			tp, err := newTracerProvider(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := tp.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			res, err := tracingResource(c)
			if err != nil {
				t.Fatal(err)
			}
			if name, _ := res.Set().Value("service.name"); name.AsString() != "llm-d-async" {
				t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", name.AsString())
			}
		})
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := newTracerProvider(config.Tracing{OTLPEndpoint: "http://c:4318"}); err == nil || !strings.Contains(err.Error(), "http/json") {
		t.Fatalf("unsupported protocol: %v", err)
	}
}

// A request handed back at shutdown gets upstream's "re-enqueue" span,
// linked to the span of the attempt that was cut short.
func TestTracingReEnqueue(t *testing.T) {
	gw, url := newGateway(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(t.Context()) }()
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(200 * time.Millisecond),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url}}},
	}
	h := startAppWith(t, cfg, Options{Transport: memory.New(memory.Options{}), TracerProvider: tp})
	if err := h.mem.Enqueue(e2eQueue, request("long", time.Now().Add(time.Minute), map[string]any{"sleep_ms": 10_000})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(gw.attempts("long")) == 1 }, 5*time.Second)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	byName := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		byName[s.Name] = s
	}
	proc, ok1 := byName["process-request"]
	re, ok2 := byName["re-enqueue"]
	if !ok1 || !ok2 {
		t.Fatalf("spans %v, want process-request and re-enqueue", keys(byName))
	}
	if len(re.Links) != 1 || re.Links[0].SpanContext.SpanID() != proc.SpanContext.SpanID() {
		t.Errorf("re-enqueue links %+v, want the process-request span %s", re.Links, proc.SpanContext.SpanID())
	}
}
