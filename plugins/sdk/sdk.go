// Package sdk is what the author of an out-of-process dispatch gate imports,
// and the one place that maps gates onto the plugin protocol.
//
// A plugin is a separate binary whose main only calls Serve with its gate:
//
//	func main() { sdk.Serve(&myGate{}) }
//
// The gate implements core/gate.Gate (Budget) and, optionally,
// core/gate.Admitter (Admit, called per request when the queue sets
// gate_params.admit to "true"), core/gate.Describer (Describe, logged at start)
// and Configurer (Configure, which receives the queue's gate_params). sluice
// runs the binary through hashicorp/go-plugin and talks gRPC to it (see
// plugins/gatepb/gate.proto); the caller's deadline crosses the boundary as a
// gRPC deadline, so Budget and Admit receive a context that expires when the
// host stops waiting.
//
// The package follows go-plugin's examples/grpc: it holds the handshake, the
// plugin set and both gRPC adapters. The server adapter (server.go) serves a
// gate in the plugin process; the client adapter (client.go) is what the host
// gets from Dispense: a Remote, itself a gate.Gate, so that the host
// (plugins/host) only supervises the process and never sees a protobuf.
//
// A plugin can run the same conformance suite as the built-in gates
// (gates/gatetest) against its gate in-process, and against the built binary
// through plugins/host.
package sdk

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/plugins/gatepb"
)

// PluginName is the name under which the gate is served in go-plugin's
// plugin set.
const PluginName = "gate"

// Handshake is the handshake host and plugin agree on. ProtocolVersion
// changes when gate.proto changes incompatibly; the magic cookie only keeps
// the binary from doing anything when it is run by hand.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "SLUICE_GATE_PLUGIN",
	MagicCookieValue: "6f0c1d2e-sluice-gate-v1",
}

// Configurer is implemented by gates that take parameters. Configure is
// called once, before any other call, with every gate_params entry the host
// did not consume itself (path, args, admit, start_timeout, restart_backoff,
// restart_backoff_max, failure_policy and refresh_interval stay in the host).
// It returns an error for an invalid value; the SDK reports every parameter
// Configure never read (gate.Params marks what it reads) as unknown, so a
// Configure need not call Unused itself. A gate that does not implement
// Configurer accepts no parameters.
type Configurer interface {
	Configure(params gate.Params) error
}

// Remote is a gate served by a plugin process, as the host sees it: what
// Dispense returns for PluginName. It is a gate.Gate and a gate.Admitter (a
// plugin without Admit admits every request), plus the two calls of the
// protocol that are not queries. Every method is one gRPC round trip that
// carries ctx's deadline and cancellation to the plugin, and is safe for
// concurrent use.
//
// Budget returns a budget in [0,1], a *gate.FallbackError when the plugin
// applied a fallback of its own, or an error (an answer outside [0,1] is one).
// An error of any method matches ErrUnavailable (errors.Is) when the plugin
// could not be reached: its process died or its connection broke. Any other
// error fails that call only; the plugin's own errors keep their gRPC status
// (codes.Unknown, or DeadlineExceeded and Canceled for context errors).
//
// Closing the connection is the go-plugin client's job, not Remote's.
type Remote interface {
	gate.Gate
	gate.Admitter
	// Configure sends the plugin its parameters; it is called once, before
	// any query. It reports whether the plugin implements Admit. When the
	// plugin refuses the parameters the error matches ErrRefused and its
	// message is the plugin's own.
	Configure(ctx context.Context, params map[string]string) (admitter bool, err error)
	// Describe returns the plugin's one-line description of when it closes,
	// "" when it has none.
	Describe(ctx context.Context) (string, error)
}

var (
	// ErrUnavailable is matched by a Remote's error when the plugin could
	// not be reached (gRPC's codes.Unavailable): a supervisor restarts it.
	ErrUnavailable = errors.New("plugin unavailable")
	// ErrRefused is matched by Remote.Configure's error when the plugin
	// refused its parameters: permanent, since a restart cannot fix them.
	ErrRefused = errors.New("plugin refused its parameters")
)

// Serve serves impl as a gate plugin on the process's stdin/stdout handshake
// and never returns until the host closes the plugin. It is the only call a
// plugin's main makes.
func Serve(impl gate.Gate) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         PluginSet(impl),
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}

// PluginSet returns the go-plugin plugin set that serves impl (host side:
// PluginSet(nil), whose Dispense returns a Remote).
func PluginSet(impl gate.Gate) plugin.PluginSet {
	return plugin.PluginSet{PluginName: &Plugin{Impl: impl}}
}

// Plugin is the go-plugin glue: on the plugin side it registers Impl as the
// gRPC Gate service; on the host side it hands out a Remote.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the gate served (plugin side only).
	Impl gate.Gate
}

var _ plugin.GRPCPlugin = (*Plugin)(nil)

// GRPCServer registers the server adapter of Impl.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("sdk: no gate to serve")
	}
	gatepb.RegisterGateServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns the client adapter, a Remote, on the plugin's connection.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &client{rpc: gatepb.NewGateClient(c)}, nil
}
