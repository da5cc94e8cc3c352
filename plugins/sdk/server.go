package sdk

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/gatepb"
)

// server is the plugin side's adapter: it serves a gate.Gate as the gRPC
// Gate service, finding its optional interfaces by type assertion.
type server struct {
	gatepb.UnimplementedGateServer
	impl gate.Gate

	mu         sync.Mutex
	configured bool
}

var _ gatepb.GateServer = (*server)(nil)

// Configure passes the parameters to the gate's Configurer and reports the
// ones it did not read. A second Configure is refused.
func (s *server) Configure(_ context.Context, req *gatepb.ConfigureRequest) (*gatepb.ConfigureResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, admitter := s.impl.(gate.Admitter)
	resp := &gatepb.ConfigureResponse{Admitter: admitter}
	if s.configured {
		resp.Error = "configured twice"
		return resp, nil
	}
	params := gate.NewParams(req.GetParams())
	if c, ok := s.impl.(Configurer); ok {
		if err := c.Configure(params); err != nil {
			resp.Error = err.Error()
			return resp, nil
		}
	}
	if err := params.Unused(); err != nil {
		resp.Error = err.Error()
		return resp, nil
	}
	s.configured = true
	return resp, nil
}

// Budget asks the gate; a *gate.FallbackError travels as a fallback budget,
// any other error as a gRPC status.
func (s *server) Budget(ctx context.Context, _ *gatepb.BudgetRequest) (*gatepb.BudgetResponse, error) {
	b, err := s.impl.Budget(ctx)
	if err == nil {
		return &gatepb.BudgetResponse{Budget: b}, nil
	}
	var fb *gate.FallbackError
	if !errors.As(err, &fb) {
		return nil, toStatus(err)
	}
	msg := "fallback"
	if fb.Err != nil {
		msg = fb.Err.Error()
	}
	return &gatepb.BudgetResponse{Budget: fb.Budget, Fallback: msg}, nil
}

// Admit rebuilds the request (without payload) and asks the gate's Admitter;
// a gate that has none admits everything.
func (s *server) Admit(ctx context.Context, req *gatepb.AdmitRequest) (*gatepb.AdmitResponse, error) {
	a, ok := s.impl.(gate.Admitter)
	if !ok {
		return &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, nil
	}
	d, err := a.Admit(ctx, requestFromProto(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return decisionToProto(d)
}

// Describe returns the gate's description, if it has one.
func (s *server) Describe(context.Context, *gatepb.DescribeRequest) (*gatepb.DescribeResponse, error) {
	if d, ok := s.impl.(gate.Describer); ok {
		return &gatepb.DescribeResponse{Description: d.Describe()}, nil
	}
	return &gatepb.DescribeResponse{}, nil
}

// toStatus keeps context errors recognisable on the other side; the gate's
// own failures travel as codes.Unknown (codes.Unavailable is left to the
// transport, so the host can tell a broken plugin from a failing backend).
func toStatus(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// requestFromProto rebuilds the request a plugin's Admit sees.
func requestFromProto(in *gatepb.AdmitRequest) *wire.Request {
	req := &wire.Request{
		ID:         in.GetId(),
		Metadata:   in.GetMetadata(),
		Headers:    in.GetHeaders(),
		Endpoint:   in.GetEndpoint(),
		RetryCount: int(in.GetRetryCount()),
	}
	if ms := in.GetDeadlineUnixMs(); ms != 0 {
		req.Deadline = time.UnixMilli(ms)
	}
	if ms := in.GetCreatedUnixMs(); ms != 0 {
		req.Created = time.UnixMilli(ms)
	}
	return req
}

// decisionToProto encodes a decision; an unknown verdict is the gate's bug,
// reported as codes.Internal.
func decisionToProto(d gate.Decision) (*gatepb.AdmitResponse, error) {
	out := &gatepb.AdmitResponse{Reason: d.Reason}
	switch d.Verdict {
	case gate.Admit:
		out.Verdict = gatepb.Verdict_VERDICT_ADMIT
	case gate.Defer:
		out.Verdict = gatepb.Verdict_VERDICT_DEFER
		out.DelayMs = max(d.Delay, 0).Milliseconds()
	case gate.Reject:
		out.Verdict = gatepb.Verdict_VERDICT_REJECT
	default:
		return nil, status.Errorf(codes.Internal, "unknown verdict %v", d.Verdict)
	}
	return out, nil
}
