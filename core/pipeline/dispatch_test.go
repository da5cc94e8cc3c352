package pipeline

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

type fixedDispatcher dispatch.Outcome

func (f fixedDispatcher) DoWith(context.Context, dispatch.Target, *wire.Request, dispatch.Overrides) dispatch.Outcome {
	return dispatch.Outcome(f)
}

// dispatchHandler maps each class of outcome to what the request gets: the
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
		{"cancelled", dispatch.Outcome{Class: dispatch.Cancelled, Err: errCancelled}, wire.Result{ErrorCode: wire.CodeCancelled, ErrorMessage: "cancelled during dispatch"}, false},
		{"503", dispatch.Outcome{Class: dispatch.Retryable, StatusCode: 503}, wire.Result{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := message.NewMessage("1", nil)
			d := &delivery{Queue: q, Msg: m, Ctx: context.Background(), Req: &wire.Request{ID: "r"}}
			m.SetContext(context.WithValue(m.Context(), deliveryKey{}, d))
			out, err := dispatchHandler(fixedDispatcher(tc.o), nil)(m)
			var re *retryableError
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
