package sdk

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

// server is the plugin side's adapter: it serves a Gate as the gRPC Gate
// service of one protocol version, finding its optional interfaces by type
// assertion.
type server struct {
	gatepb.UnimplementedGateServer
	impl     Gate
	admitter Admitter // nil when impl has no Admit
	version  int
	sdk      string

	mu         sync.Mutex
	configured bool
}

var _ gatepb.GateServer = (*server)(nil)

func newServer(impl Gate, version int) *server {
	a, _ := impl.(Admitter)
	return &server{impl: impl, admitter: a, version: version, sdk: sdkName()}
}

// Configure passes the parameters to the gate's Configurer and reports the
// ones it did not read. A second Configure is refused.
func (s *server) Configure(_ context.Context, req *gatepb.ConfigureRequest) (*gatepb.ConfigureResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &gatepb.ConfigureResponse{Admitter: s.admitter != nil}
	if s.configured {
		resp.Error = "configured twice"
		return resp, nil
	}
	params := NewParams(req.GetParams())
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

// Budget asks the gate; a *FallbackError travels as a fallback budget, any
// other error as a gRPC status.
func (s *server) Budget(ctx context.Context, _ *gatepb.BudgetRequest) (*gatepb.BudgetResponse, error) {
	b, err := s.impl.Budget(ctx)
	if err == nil {
		return &gatepb.BudgetResponse{Budget: b}, nil
	}
	var fb *FallbackError
	if !errors.As(err, &fb) {
		return nil, toStatus(err)
	}
	msg := "fallback"
	if fb.Err != nil {
		msg = fb.Err.Error()
	}
	return &gatepb.BudgetResponse{Budget: fb.Budget, Fallback: msg}, nil
}

// Admit rebuilds the request (without payload) and asks the gate's
// Admitter; a gate that has none admits everything.
func (s *server) Admit(ctx context.Context, in *gatepb.AdmitRequest) (*gatepb.AdmitResponse, error) {
	if s.admitter == nil {
		return &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, nil
	}
	req := requestFromProto(in)
	d, err := s.admitter.Admit(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return decisionToProto(d, req.changed, s.version)
}

// Describe returns the gate's description and, from v2, what it can do.
func (s *server) Describe(context.Context, *gatepb.DescribeRequest) (*gatepb.DescribeResponse, error) {
	out := &gatepb.DescribeResponse{}
	if d, ok := s.impl.(Describer); ok {
		out.Description = d.Describe()
	}
	if s.version >= ProtocolV2 {
		out.Admitter = s.admitter != nil
		out.Sdk = s.sdk
	}
	return out, nil
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
func requestFromProto(in *gatepb.AdmitRequest) *Request {
	req := &Request{
		ID:         in.GetId(),
		Metadata:   in.GetMetadata(),
		Headers:    in.GetHeaders(),
		Endpoint:   in.GetEndpoint(),
		RetryCount: int(in.GetRetryCount()),
		Labels:     in.GetLabels(),
	}
	if ms := in.GetDeadlineUnixMs(); ms != 0 {
		req.Deadline = time.UnixMilli(ms)
	}
	if ms := in.GetCreatedUnixMs(); ms != 0 {
		req.Created = time.UnixMilli(ms)
	}
	return req
}

// decisionToProto encodes a decision and the labels Admit set. Under
// protocol v1 a Wait cannot be told to the host (codes.Unimplemented) and
// labels are not sent; an unknown verdict is the gate's bug, reported as
// codes.Internal.
func decisionToProto(d Decision, labels map[string]string, version int) (*gatepb.AdmitResponse, error) {
	out := &gatepb.AdmitResponse{Reason: d.Reason}
	if version >= ProtocolV2 {
		out.Labels = labels
	}
	delay := max(d.Delay, 0).Milliseconds()
	switch d.Verdict {
	case Admit:
		out.Verdict = gatepb.Verdict_VERDICT_ADMIT
	case Defer:
		out.Verdict = gatepb.Verdict_VERDICT_DEFER
		out.DelayMs = delay
	case Reject:
		out.Verdict = gatepb.Verdict_VERDICT_REJECT
	case Wait:
		if version < ProtocolV2 {
			return nil, status.Error(codes.Unimplemented, "the wait verdict needs protocol version 2; this sluice speaks version 1")
		}
		out.Verdict = gatepb.Verdict_VERDICT_WAIT
		out.DelayMs = delay
	default:
		return nil, status.Errorf(codes.Internal, "unknown verdict %v", d.Verdict)
	}
	return out, nil
}
