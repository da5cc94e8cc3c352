// Command v1plugin is a gate plugin built for protocol version 1, frozen:
// it is written against its own copy of the v1 generated code (./gatepb)
// and go-plugin alone, as a plugin built with the SDK of protocol v1 was.
// plugins/host's tests build it to check that a host speaking a newer
// protocol still runs it.
//
// gate_params: "level" (the budget, default 1). Admit rejects
// metadata.tenant "blocked", defers "later" by 100ms, answers verdict 3
// (unknown in v1) for "bogus", and admits everyone else.
package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/sluice-io/sluice/plugins/host/testdata/v1plugin/gatepb"
)

type server struct {
	gatepb.UnimplementedGateServer
	mu    sync.Mutex
	level float64
}

func (s *server) Configure(_ context.Context, req *gatepb.ConfigureRequest) (*gatepb.ConfigureResponse, error) {
	resp := &gatepb.ConfigureResponse{Admitter: true}
	level := 1.0
	for k, v := range req.GetParams() {
		if k != "level" {
			resp.Error = "unknown gate_params: " + k
			return resp, nil
		}
		l, err := strconv.ParseFloat(v, 64)
		if err != nil {
			resp.Error = fmt.Sprintf("gate_params.level: %q is not a number", v)
			return resp, nil
		}
		level = l
	}
	s.mu.Lock()
	s.level = level
	s.mu.Unlock()
	return resp, nil
}

func (s *server) Budget(context.Context, *gatepb.BudgetRequest) (*gatepb.BudgetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &gatepb.BudgetResponse{Budget: s.level}, nil
}

func (s *server) Admit(_ context.Context, req *gatepb.AdmitRequest) (*gatepb.AdmitResponse, error) {
	switch req.GetMetadata()["tenant"] {
	case "blocked":
		return &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_REJECT, Reason: "blocked by v1"}, nil
	case "later":
		return &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_DEFER, DelayMs: 100, Reason: "later"}, nil
	case "bogus":
		return &gatepb.AdmitResponse{Verdict: gatepb.Verdict(3)}, nil
	}
	return &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, nil
}

func (s *server) Describe(context.Context, *gatepb.DescribeRequest) (*gatepb.DescribeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &gatepb.DescribeResponse{Description: fmt.Sprintf("v1 plugin at level %v", s.level)}, nil
}

// gatePlugin is the go-plugin glue of protocol v1.
type gatePlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

func (gatePlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	gatepb.RegisterGateServer(s, &server{level: 1})
	return nil
}

func (gatePlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, fmt.Errorf("plugin side only")
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{
			ProtocolVersion:  1,
			MagicCookieKey:   "SLUICE_GATE_PLUGIN",
			MagicCookieValue: "6f0c1d2e-sluice-gate-v1",
		},
		Plugins:    plugin.PluginSet{"gate": gatePlugin{}},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}
