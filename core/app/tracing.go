package app

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-io/sluice/core/config"
)

// The OpenTelemetry environment variables sluice reads itself; the exporters
// and the SDK read the other standard ones (OTEL_EXPORTER_OTLP_HEADERS,
// _INSECURE, _TIMEOUT, OTEL_BSP_*, ...).
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSampler        = "OTEL_TRACES_SAMPLER"
)

// tracingEnabled reports whether tracing is on: sluice's own
// tracing.otlp_endpoint (--otlp-endpoint), or, as upstream, an OTLP endpoint
// in the environment.
func tracingEnabled(c config.Tracing) bool {
	return c.OTLPEndpoint != "" || os.Getenv(envEndpoint) != "" || os.Getenv(envTracesEndpoint) != ""
}

// tracingProtocol is the OTLP protocol: OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL
// when set; otherwise gRPC, as upstream, unless the endpoint is sluice's own
// tracing.otlp_endpoint, which has always meant OTLP/HTTP.
func tracingProtocol(c config.Tracing) string {
	for _, k := range []string{envTracesProtocol, envProtocol} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	if c.OTLPEndpoint != "" {
		return "http/protobuf"
	}
	return "grpc"
}

// newTracerProvider builds the OpenTelemetry tracer provider (call it when
// tracingEnabled): spans batched to the OTLP exporter of tracingProtocol; the
// resource is service.name from the config, overridden by OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES; the sampler is OTEL_TRACES_SAMPLER[_ARG]
// when set, else parent-based with the config's ratio for requests whose
// producer sent no sampled trace context. The exporters connect lazily, so
// building it does no I/O.
func newTracerProvider(c config.Tracing) (*sdktrace.TracerProvider, error) {
	ctx := context.Background()
	var exp sdktrace.SpanExporter
	var err error
	switch p := tracingProtocol(c); p {
	case "grpc":
		var opts []otlptracegrpc.Option
		if c.OTLPEndpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.OTLPEndpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	case "http/protobuf":
		var opts []otlptracehttp.Option
		if c.OTLPEndpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(c.OTLPEndpoint))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q: sluice exports over grpc or http/protobuf", p)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := tracingResource(c)
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if os.Getenv(envSampler) == "" { // else the SDK reads OTEL_TRACES_SAMPLER[_ARG] itself
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

// tracingResource is service.name from the config, overridden by
// OTEL_SERVICE_NAME and completed by OTEL_RESOURCE_ATTRIBUTES.
func tracingResource(c config.Tracing) (*resource.Resource, error) {
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", c.ServiceName)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return res, nil
}
