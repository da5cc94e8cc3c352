package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

func TestBackoffDoublesToCapWithJitter(t *testing.T) {
	p := RetryPolicy{}
	p.SetDefaults()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		retries int
		centre  time.Duration
	}{{0, 2 * time.Second}, {1, 4 * time.Second}, {2, 8 * time.Second}, {4, 32 * time.Second}, {5, 60 * time.Second}, {50, 60 * time.Second}, {1000, 60 * time.Second}} {
		lo, hi := time.Duration(float64(tc.centre)*0.8), time.Duration(float64(tc.centre)*1.2)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := p.Backoff(tc.retries)
			if d < lo || d > hi {
				t.Fatalf("retries %d: backoff %s outside [%s, %s]", tc.retries, d, lo, hi)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("retries %d: only %d distinct delays: no jitter?", tc.retries, len(seen))
		}
	}
	noJitter := RetryPolicy{Base: time.Second, Max: 10 * time.Second, Jitter: -1}
	noJitter.SetDefaults()
	if d := noJitter.Backoff(3); d != 8*time.Second {
		t.Errorf("no jitter: %s, want 8s", d)
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	for _, p := range []RetryPolicy{
		{Base: 2 * time.Second, Max: time.Second, Jitter: 0.1},
		{Base: time.Second, Max: time.Second, Jitter: 2},
		{Base: time.Second, Max: time.Second, MaxAttempts: -1},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

func TestInflightCancelByJobAndID(t *testing.T) {
	f := NewInflight()
	type entry struct {
		ctx  context.Context
		done func()
	}
	reg := func(id, job string) entry {
		ctx, cancel := context.WithCancelCause(context.Background())
		return entry{ctx, f.Register(&wire.Request{ID: id, Metadata: map[string]string{"job_id": job}}, cancel)}
	}
	a1, a2, b1 := reg("a1", "A"), reg("a2", "A"), reg("b1", "B")
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 2 {
		t.Fatalf("cancelled %d, want 2", n)
	}
	for _, e := range []entry{a1, a2} {
		if !errors.Is(context.Cause(e.ctx), ErrCancelled) {
			t.Errorf("cause %v, want ErrCancelled", context.Cause(e.ctx))
		}
	}
	if b1.ctx.Err() != nil {
		t.Error("job B cancelled with job A")
	}
	a1.done()
	a2.done()
	if n := f.Cancel(transport.Cancellation{RequestID: "b1"}); n != 1 || b1.ctx.Err() == nil {
		t.Errorf("cancel by id: %d", n)
	}
	b1.done()
	if f.Len() != 0 {
		t.Errorf("%d entries left", f.Len())
	}
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 0 {
		t.Errorf("cancelled %d finished requests", n)
	}
}

// blockingAdmitter blocks until its context ends and records the deadline
// the context carried.
type blockingAdmitter struct{ deadline chan time.Time }

func (a blockingAdmitter) Admit(ctx context.Context, _ *wire.Request) (gate.Decision, error) {
	dl, _ := ctx.Deadline()
	a.deadline <- dl
	<-ctx.Done()
	return gate.Decision{}, ctx.Err()
}

// The deadline middleware adds no context; the admission hook is still
// bounded by the request's deadline, and a request whose hook outlives its
// deadline ends with a DEADLINE_EXCEEDED result instead of hanging.
func TestAdmissionBoundedByDeadline(t *testing.T) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	adm := blockingAdmitter{deadline: make(chan time.Time, 1)}
	q := &Queue{metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""), admitter: adm}
	deadline := time.Now().Add(150 * time.Millisecond)
	payload := fmt.Appendf(nil, `{"id":"r1","deadline":%d,"payload":{"model":"m"}}`, deadline.Unix())
	// Unix seconds are too coarse for a 150 ms deadline: set it on the
	// decoded request instead, before the deadline middleware runs.
	setDeadline := func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			From(m).Req.Deadline = deadline
			return next(m)
		}
	}
	requeued := false
	requeue := func(context.Context, *Delivery, []byte, time.Time) error { requeued = true; return nil }
	dead := func(context.Context, *Delivery, string) error { return errors.New("dead-lettered") }
	log := slog.New(slog.DiscardHandler)
	var h message.HandlerFunc = func(*message.Message) ([]*message.Message, error) {
		t.Error("dispatched although admission never admitted")
		return nil, nil
	}
	for _, m := range []message.HandlerMiddleware{Admission(requeue, time.Second, time.Minute, nil, log), Deadline(), setDeadline, Decode(dead, log), Recover(q, context.Background(), dead, log)} {
		h = m(h)
	}
	done := make(chan []*message.Message, 1)
	go func() {
		out, err := h(message.NewMessage("1", payload))
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	select {
	case dl := <-adm.deadline:
		if !dl.Equal(deadline) {
			t.Fatalf("admission context deadline %v, want the request's %v", dl, deadline)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("admission hook not called")
	}
	select {
	case out := <-done:
		if requeued {
			// An admission error defers; a deferral past the deadline is
			// answered instead of re-queued.
			t.Fatal("re-queued past the deadline")
		}
		if len(out) != 1 || !strings.Contains(string(out[0].Payload), string(wire.CodeDeadlineExceeded)) {
			t.Fatalf("got %d results (%v), want one %s result", len(out), out, wire.CodeDeadlineExceeded)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the admission hook was not cut off at the request's deadline")
	}
}

type fixedDispatcher dispatch.Outcome

func (f fixedDispatcher) DoWith(context.Context, dispatch.Target, *wire.Request, dispatch.Overrides) dispatch.Outcome {
	return dispatch.Outcome(f)
}

// Dispatch maps each class of outcome to what the request gets: the
// gateway's answer as it came (success, or a non-retryable status, with or
// without a body), an error result when no usable answer came back, or a
// retry.
func TestDispatchOutcomes(t *testing.T) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	q := &Queue{metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, "")}
	tooLarge := fmt.Errorf("post x: status 200: %w", dispatch.ErrResponseTooLarge)
	for _, tc := range []struct {
		name  string
		o     dispatch.Outcome
		want  wire.Result // ID and Metadata are not compared
		retry bool
	}{
		{"success", dispatch.Outcome{Class: dispatch.Success, StatusCode: 200, Body: []byte(`{"ok":1}`)}, wire.Result{StatusCode: 200, Payload: `{"ok":1}`}, false},
		{"4xx with a body", dispatch.Outcome{Class: dispatch.Fatal, StatusCode: 404, Body: []byte(`nope`)}, wire.Result{StatusCode: 404, Payload: `nope`}, false},
		{"4xx without a body", dispatch.Outcome{Class: dispatch.Fatal, StatusCode: 400}, wire.Result{StatusCode: 400}, false},
		{"too large", dispatch.Outcome{Class: dispatch.Fatal, StatusCode: 200, Err: tooLarge}, wire.Result{ErrorCode: wire.CodeInferenceError, ErrorMessage: tooLarge.Error() + " (limit: dispatch.max_response_bytes)"}, false},
		{"deadline", dispatch.Outcome{Class: dispatch.DeadlineExceeded}, wire.Result{ErrorCode: wire.CodeDeadlineExceeded, ErrorMessage: "deadline exceeded"}, false},
		{"cancelled", dispatch.Outcome{Class: dispatch.Cancelled, Err: ErrCancelled}, wire.Result{ErrorCode: wire.CodeCancelled, ErrorMessage: "cancelled during dispatch"}, false},
		{"503", dispatch.Outcome{Class: dispatch.Retryable, StatusCode: 503}, wire.Result{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := message.NewMessage("1", nil)
			d := &Delivery{Queue: q, Msg: m, Ctx: context.Background(), Req: &wire.Request{ID: "r"}}
			m.SetContext(context.WithValue(m.Context(), deliveryKey{}, d))
			out, err := Dispatch(fixedDispatcher(tc.o), nil)(m)
			var re *RetryableError
			if tc.retry {
				if !errors.As(err, &re) {
					t.Fatalf("err %v, want a RetryableError", err)
				}
				return
			}
			if err != nil || len(out) != 1 || d.Result == nil {
				t.Fatalf("out %v, err %v, result %v", out, err, d.Result)
			}
			r := d.Result
			got := [4]any{r.StatusCode, r.Payload, r.ErrorCode, r.ErrorMessage}
			if r.ErrorCode != wire.CodeNone {
				got[1] = "" // the error payload wraps the message
			}
			if want := [4]any{tc.want.StatusCode, tc.want.Payload, tc.want.ErrorCode, tc.want.ErrorMessage}; got != want {
				t.Errorf("result %+v, want %+v", got, tc.want)
			}
		})
	}
}
