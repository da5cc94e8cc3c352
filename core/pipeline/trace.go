package pipeline

import (
	"maps"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice/core/wire"
)

// TracerName names sluice's tracer.
const TracerName = "github.com/sluice-io/sluice"

// headerCarrier reads and writes W3C trace context in a request's headers,
// whatever the case of their names.
type headerCarrier map[string]string

func (h headerCarrier) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) {
	for k := range h {
		if strings.EqualFold(k, key) {
			delete(h, k)
		}
	}
	h[key] = value
}

func (h headerCarrier) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

// Trace starts one span per delivery of a decoded request, as a child of the
// trace context the producer put in the request's headers (traceparent), and
// passes the span's context to the gateway as W3C traceparent / tracestate
// headers. It goes right after Decode; without a tracer provider the chain
// does not include it.
func Trace(tp trace.TracerProvider) message.HandlerMiddleware {
	tracer := tp.Tracer(TracerName)
	prop := propagation.TraceContext{}
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := From(m)
			req := d.Req
			parent := prop.Extract(d.Ctx, headerCarrier(req.Headers))
			ctx, span := tracer.Start(parent, "sluice.request "+d.Queue.ID, trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(
					attribute.String("sluice.queue", d.Queue.Name),
					attribute.String("sluice.request.id", req.ID),
					attribute.String("sluice.job.id", req.JobID()),
					attribute.Int("sluice.attempt", req.RetryCount+1),
				))
			defer span.End()
			if span.SpanContext().IsValid() {
				h := make(map[string]string, len(req.Headers)+2)
				maps.Copy(h, req.Headers)
				prop.Inject(ctx, headerCarrier(h))
				traced := *req
				traced.Headers = h
				d.Req = &traced
			}
			d.Ctx = ctx
			out, err := next(m)
			record(span, d, err)
			return out, err
		}
	}
}

// record puts the delivery's outcome on its span.
func record(span trace.Span, d *Delivery, err error) {
	if d.Dispatch.StatusCode != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", d.Dispatch.StatusCode))
	}
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case d.Outcome == Requeued:
		span.SetAttributes(attribute.String("sluice.outcome", "requeued"))
	case d.Result != nil && d.Result.ErrorCode != wire.CodeNone:
		span.SetAttributes(attribute.String("sluice.outcome", string(d.Result.ErrorCode)))
		span.SetStatus(codes.Error, d.Result.ErrorMessage)
	case d.Result != nil:
		span.SetAttributes(attribute.String("sluice.outcome", "ok"))
	default:
		span.SetAttributes(attribute.String("sluice.outcome", strconv.Itoa(int(d.Outcome))))
	}
}
