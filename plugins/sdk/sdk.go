// Package sdk is what the author of an out-of-process dispatch gate for
// sluice imports. It is a Go module of its own
// (github.com/sluice-io/sluice/plugins/sdk, tagged plugins/sdk/vX.Y.Z) that
// requires only go-plugin, gRPC and protobuf.
//
// A plugin is a separate binary whose main only calls Serve with its gate:
//
//	func main() { sdk.Serve(&myGate{}) }
//
// The gate implements Gate (Budget) and, optionally, Admitter (Admit,
// called per request when the queue sets gate_params.admit to "true"),
// Describer (Describe, logged at start) and Configurer (Configure, which
// receives the queue's gate_params). sluice runs the binary through
// hashicorp/go-plugin and talks gRPC to it (see gatepb/gate.proto); the
// caller's deadline crosses the boundary as a gRPC deadline, so Budget and
// Admit receive a context that ends when sluice stops waiting.
//
// The package follows go-plugin's examples/grpc: it holds the handshake,
// the versioned plugin sets and the server adapter (server.go), which serves
// a Gate as the gRPC Gate service. The host side (sluice's plugins/host)
// dispenses a raw gatepb.GateClient from ClientPlugins and does its own
// mapping onto sluice's types, so that this module never imports sluice.
package sdk

import (
	"context"
	"errors"
	"runtime/debug"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

// PluginName is the name under which the gate is served in go-plugin's
// plugin set.
const PluginName = "gate"

// The protocol versions this SDK speaks. The handshake negotiates the
// highest one both sides know: version 2 adds the Wait verdict, labels
// (read and set by Admit) and capabilities in Describe. See docs/plugins.md
// for the compatibility policy.
const (
	ProtocolV1 = 1
	ProtocolV2 = 2
	// ProtocolLatest is the highest version this SDK serves.
	ProtocolLatest = ProtocolV2
)

// ModulePath is the SDK's Go module path.
const ModulePath = "github.com/sluice-io/sluice/plugins/sdk"

// Handshake is the handshake host and plugin agree on. Its ProtocolVersion
// is the oldest version (1); the versions actually offered are the keys of
// ServerPlugins and ClientPlugins. The magic cookie only keeps the binary
// from doing anything when it is run by hand; it never changes.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolV1,
	MagicCookieKey:   "SLUICE_GATE_PLUGIN",
	MagicCookieValue: "6f0c1d2e-sluice-gate-v1",
}

// Serve serves impl as a gate plugin on the process's stdin/stdout
// handshake and never returns until the host closes the plugin. It is the
// only call a plugin's main makes. It serves every protocol version the SDK
// knows; go-plugin picks the highest one the host offers.
func Serve(impl Gate) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: ServerPlugins(impl),
		GRPCServer:       plugin.DefaultGRPCServer,
	})
}

// ServerPlugins returns the plugin sets that serve impl, by protocol
// version.
func ServerPlugins(impl Gate) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolV1: {PluginName: &Plugin{Impl: impl, Version: ProtocolV1}},
		ProtocolV2: {PluginName: &Plugin{Impl: impl, Version: ProtocolV2}},
	}
}

// ClientPlugins returns the plugin sets a host offers, by protocol version:
// each dispenses a gatepb.GateClient on the plugin's connection (the
// client's NegotiatedVersion says which version it speaks).
func ClientPlugins() map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolV1: {PluginName: &Plugin{Version: ProtocolV1}},
		ProtocolV2: {PluginName: &Plugin{Version: ProtocolV2}},
	}
}

// Plugin is the go-plugin glue: on the plugin side it registers Impl as
// the gRPC Gate service of protocol Version; on the host side it hands out
// a gatepb.GateClient.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the gate served (plugin side only).
	Impl Gate
	// Version is the protocol version this set speaks.
	Version int
}

var _ plugin.GRPCPlugin = (*Plugin)(nil)

// GRPCServer registers the server adapter of Impl.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("sdk: no gate to serve")
	}
	gatepb.RegisterGateServer(s, newServer(p.Impl, p.Version))
	return nil
}

// GRPCClient returns a gatepb.GateClient on the plugin's connection.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return gatepb.NewGateClient(c), nil
}

// sdkName names this SDK and, when the binary records it, its module
// version, for Describe's sdk field.
func sdkName() string {
	const name = "sluice-sdk-go"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return name
	}
	for _, m := range info.Deps {
		if m.Path == ModulePath {
			return name + "/" + m.Version
		}
	}
	return name
}
