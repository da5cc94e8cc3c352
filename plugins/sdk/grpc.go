package sdk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	gatepb "github.com/sluice-io/sluice/plugins/gatepb"
)

// Plugin is the go-plugin glue: on the plugin side it registers Impl as the
// gRPC Gate service; on the host side it hands out a gatepb.GateClient.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the gate served (plugin side only).
	Impl gate.Gate
}

var _ plugin.GRPCPlugin = (*Plugin)(nil)

// GRPCServer registers the gate's gRPC adapter.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("sdk: no gate to serve")
	}
	gatepb.RegisterGateServer(s, NewServer(p.Impl))
	return nil
}

// GRPCClient returns a gatepb.GateClient on the plugin's connection.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return gatepb.NewGateClient(c), nil
}

// Server adapts a gate.Gate to the gRPC Gate service.
type Server struct {
	gatepb.UnimplementedGateServer
	impl gate.Gate

	mu         sync.Mutex
	configured bool
}

var _ gatepb.GateServer = (*Server)(nil)

// NewServer returns the gRPC adapter of impl.
func NewServer(impl gate.Gate) *Server { return &Server{impl: impl} }

// Configure passes the parameters to the gate's Configurer and reports the
// ones it did not read.
func (s *Server) Configure(_ context.Context, req *gatepb.ConfigureRequest) (*gatepb.ConfigureResponse, error) {
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
func (s *Server) Budget(ctx context.Context, _ *gatepb.BudgetRequest) (*gatepb.BudgetResponse, error) {
	b, err := s.impl.Budget(ctx)
	var fb *gate.FallbackError
	switch {
	case errors.As(err, &fb):
		msg := "fallback"
		if fb.Err != nil {
			msg = fb.Err.Error()
		}
		return &gatepb.BudgetResponse{Budget: fb.Budget, Fallback: msg}, nil
	case err != nil:
		return nil, toStatus(err)
	}
	return &gatepb.BudgetResponse{Budget: b}, nil
}

// Admit rebuilds the request (without payload) and asks the gate's Admitter;
// a gate that has none admits everything.
func (s *Server) Admit(ctx context.Context, req *gatepb.AdmitRequest) (*gatepb.AdmitResponse, error) {
	a, ok := s.impl.(gate.Admitter)
	if !ok {
		return &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, nil
	}
	d, err := a.Admit(ctx, RequestFromProto(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return DecisionToProto(d)
}

// Describe returns the gate's description, if it has one.
func (s *Server) Describe(context.Context, *gatepb.DescribeRequest) (*gatepb.DescribeResponse, error) {
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

// RequestToProto describes req for Admit; the payload is not sent.
func RequestToProto(req *wire.Request) *gatepb.AdmitRequest {
	out := &gatepb.AdmitRequest{
		Id:         req.ID,
		Metadata:   req.Metadata,
		Headers:    req.Headers,
		Endpoint:   req.Endpoint,
		RetryCount: int32(min(req.RetryCount, 1<<31-1)),
	}
	if !req.Deadline.IsZero() {
		out.DeadlineUnixMs = req.Deadline.UnixMilli()
	}
	if !req.Created.IsZero() {
		out.CreatedUnixMs = req.Created.UnixMilli()
	}
	return out
}

// RequestFromProto rebuilds the request a plugin's Admit sees.
func RequestFromProto(in *gatepb.AdmitRequest) *wire.Request {
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

// DecisionToProto encodes a decision.
func DecisionToProto(d gate.Decision) (*gatepb.AdmitResponse, error) {
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

// DecisionFromProto decodes a decision.
func DecisionFromProto(in *gatepb.AdmitResponse) (gate.Decision, error) {
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
