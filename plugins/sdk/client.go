package sdk

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/gatepb"
)

// client is the host side's adapter: it turns calls on a gate into calls of
// the gRPC Gate service, and the answers back.
type client struct {
	rpc gatepb.GateClient
}

var (
	_ Remote        = (*client)(nil)
	_ gate.Gate     = (*client)(nil)
	_ gate.Admitter = (*client)(nil)
)

// Configure sends params; a refusal is an error matching ErrRefused.
func (c *client) Configure(ctx context.Context, params map[string]string) (bool, error) {
	resp, err := c.rpc.Configure(ctx, &gatepb.ConfigureRequest{Params: params})
	if err != nil {
		return false, callError("configure", err)
	}
	if msg := resp.GetError(); msg != "" {
		return false, &markedError{err: errors.New(msg), mark: ErrRefused}
	}
	return resp.GetAdmitter(), nil
}

// Budget asks for the budget and checks that it is in [0,1].
func (c *client) Budget(ctx context.Context) (float64, error) {
	resp, err := c.rpc.Budget(ctx, &gatepb.BudgetRequest{})
	if err != nil {
		return 0, callError("budget", err)
	}
	b := resp.GetBudget()
	if math.IsNaN(b) || b < 0 || b > 1 {
		return 0, fmt.Errorf("budget %v outside [0,1]", b)
	}
	if fb := resp.GetFallback(); fb != "" {
		return 0, &gate.FallbackError{Budget: b, Err: errors.New(fb)}
	}
	return b, nil
}

// Admit sends req without its payload and decodes the decision.
func (c *client) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	resp, err := c.rpc.Admit(ctx, requestToProto(req))
	if err != nil {
		return gate.Decision{}, callError("admit", err)
	}
	d, err := decisionFromProto(resp)
	if err != nil {
		return gate.Decision{}, fmt.Errorf("admit: %w", err)
	}
	return d, nil
}

// Describe asks for the plugin's description.
func (c *client) Describe(ctx context.Context) (string, error) {
	resp, err := c.rpc.Describe(ctx, &gatepb.DescribeRequest{})
	if err != nil {
		return "", callError("describe", err)
	}
	return resp.GetDescription(), nil
}

// callError names the call that failed and marks an unreachable plugin with
// ErrUnavailable. The gRPC status stays reachable (status.Code works on it).
func callError(call string, err error) error {
	wrapped := fmt.Errorf("%s: %w", call, err)
	if status.Code(err) == codes.Unavailable {
		return &markedError{err: wrapped, mark: ErrUnavailable}
	}
	return wrapped
}

// markedError is err, also matching mark, with err's message only.
type markedError struct {
	err  error
	mark error
}

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// requestToProto describes req for Admit; the payload is not sent.
func requestToProto(req *wire.Request) *gatepb.AdmitRequest {
	out := &gatepb.AdmitRequest{
		Id:         req.ID,
		Metadata:   req.Metadata,
		Headers:    req.Headers,
		Endpoint:   req.Endpoint,
		RetryCount: int32(min(req.RetryCount, math.MaxInt32)),
	}
	if !req.Deadline.IsZero() {
		out.DeadlineUnixMs = req.Deadline.UnixMilli()
	}
	if !req.Created.IsZero() {
		out.CreatedUnixMs = req.Created.UnixMilli()
	}
	return out
}

// decisionFromProto decodes a decision; a negative delay counts as none.
func decisionFromProto(in *gatepb.AdmitResponse) (gate.Decision, error) {
	d := gate.Decision{Reason: in.GetReason()}
	switch in.GetVerdict() {
	case gatepb.Verdict_VERDICT_ADMIT:
		d.Verdict = gate.Admit
	case gatepb.Verdict_VERDICT_DEFER:
		d.Verdict = gate.Defer
		d.Delay = time.Duration(max(in.GetDelayMs(), 0)) * time.Millisecond
	case gatepb.Verdict_VERDICT_REJECT:
		d.Verdict = gate.Reject
	default:
		return gate.Decision{}, fmt.Errorf("unknown verdict %v", in.GetVerdict())
	}
	return d, nil
}
