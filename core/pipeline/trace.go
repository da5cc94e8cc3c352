package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice/core/redact"
	"github.com/sluice-io/sluice/core/wire"
)

// tracerName names sluice's tracer.
const tracerName = "github.com/sluice-io/sluice"

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

// traceSpans starts one span per delivery of a decoded request, named and
// attributed as upstream's ("process-request": request.id, retry.count,
// queue.id, queue.name, and error.category on failure; sluice's own
// sluice.* attributes besides). Its parent is the W3C trace context the
// producer put in the request's metadata, as upstream reads it, or else in
// its headers. The HTTP call gets a child span ("http-request", see
// httpSpan) whose context goes to the gateway as traceparent / tracestate.
// It goes right after decoder; without a tracer provider the chain does not
// include it.
func traceSpans(tp trace.TracerProvider) message.HandlerMiddleware {
	tracer := tp.Tracer(tracerName)
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			req := d.Req
			parent := propagator.Extract(d.Ctx, headerCarrier(req.Metadata))
			if !trace.SpanContextFromContext(parent).IsValid() {
				parent = propagator.Extract(d.Ctx, headerCarrier(req.Headers))
			}
			ctx, span := tracer.Start(parent, "process-request",
				trace.WithAttributes(
					attribute.String("request.id", req.ID),
					attribute.Int("retry.count", req.RetryCount),
					attribute.String("queue.id", d.Queue.ID),
					attribute.String("queue.name", d.Queue.Name),
					attribute.String("sluice.job.id", req.JobID()),
					// Upstream's names since v0.10.0, beside the legacy ones.
					attribute.String("gen_ai.request.id", req.ID),
					attribute.Int("llm_d.async.retry_count", req.RetryCount),
					attribute.String("llm_d.async.queue.id", d.Queue.ID),
					attribute.String("llm_d.async.queue.name", d.Queue.Name),
				))
			defer span.End()
			if model := requestModel(span, req); model != "" {
				span.SetAttributes(attribute.String("gen_ai.request.model", model))
			}
			d.Ctx = ctx
			out, err := next(m)
			record(span, d, err)
			if errors.Is(err, errShutdown) {
				// Handed back at shutdown: upstream's "re-enqueue" span, a
				// sibling linked to the attempt's span.
				_, re := tracer.Start(parent, "re-enqueue",
					trace.WithLinks(trace.LinkFromContext(ctx)),
					trace.WithAttributes(attribute.String("request.id", req.ID), attribute.String("gen_ai.request.id", req.ID),
						attribute.String("queue.id", d.Queue.ID), attribute.String("llm_d.async.queue.id", d.Queue.ID)))
				re.End()
			}
			return out, err
		}
	}
}

var propagator = propagation.TraceContext{}

// httpSpan starts the "http-request" span of the gateway call when the
// delivery is traced, and returns its context and the request with the
// span's trace context added to its headers; untraced, it returns d's own
// and costs nothing. end ends the span with the call's status.
func httpSpan(d *delivery) (ctx context.Context, req *wire.Request, end func(status int)) {
	parent := trace.SpanFromContext(d.Ctx)
	if !parent.SpanContext().IsValid() {
		return d.Ctx, d.Req, func(int) {}
	}
	ctx, span := parent.TracerProvider().Tracer(tracerName).Start(d.Ctx, "http-request",
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("url.full", redact.URL(d.Queue.Target.BaseURL+d.Queue.Target.Path))))
	h := make(map[string]string, len(d.Req.Headers)+2)
	maps.Copy(h, d.Req.Headers)
	propagator.Inject(ctx, headerCarrier(h))
	traced := *d.Req
	traced.Headers = h
	return ctx, &traced, func(status int) {
		if status != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", status))
		}
		if status == 0 || status >= 400 {
			span.SetStatus(codes.Error, "")
		}
		span.End()
	}
}

// record puts the delivery's outcome on its span: error.category is the
// result's error code (or "handed_back"), as upstream's span carries the
// category of its failure.
func record(span trace.Span, d *delivery, err error) {
	if d.Dispatch.StatusCode != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", d.Dispatch.StatusCode))
	}
	switch {
	case err != nil:
		span.SetAttributes(attribute.String("error.category", "handed_back"), attribute.String("llm_d.async.error.category", "handed_back"))
		span.SetStatus(codes.Error, err.Error())
	case d.Outcome == outcomeRequeued:
		span.SetAttributes(attribute.String("sluice.outcome", "requeued"))
	case d.Result != nil && d.Result.ErrorCode != wire.CodeNone:
		span.SetAttributes(attribute.String("sluice.outcome", string(d.Result.ErrorCode)),
			attribute.String("error.category", string(d.Result.ErrorCode)),
			attribute.String("llm_d.async.error.category", string(d.Result.ErrorCode)))
		span.SetStatus(codes.Error, d.Result.ErrorMessage)
	case d.Result != nil:
		span.SetAttributes(attribute.String("sluice.outcome", "ok"))
	default:
		span.SetAttributes(attribute.String("sluice.outcome", strconv.Itoa(int(d.Outcome))))
	}
}

// requestModel is the request's model for gen_ai.request.model, as upstream
// takes it: the request's model field, or else, only when the span records,
// a top-level string "model" in the payload.
func requestModel(span trace.Span, req *wire.Request) string {
	if req.Model != "" || !span.IsRecording() {
		return req.Model
	}
	var p struct {
		Model any `json:"model"`
	}
	if json.Unmarshal(req.Payload, &p) != nil {
		return ""
	}
	m, _ := p.Model.(string)
	return m
}
