// Package sdk is what the author of an out-of-process dispatch gate imports.
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
// plugins/proto/gate.proto); the caller's deadline crosses the boundary as a
// gRPC deadline, so Budget and Admit receive a context that expires when the
// host stops waiting.
//
// A plugin can run the same conformance suite as the built-in gates
// (gates/gatetest) against its gate in-process, and against the built binary
// through plugins/host.
package sdk

import (
	"github.com/hashicorp/go-plugin"

	"github.com/sluice-io/sluice/core/gate"
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
// PluginSet(nil)).
func PluginSet(impl gate.Gate) plugin.PluginSet {
	return plugin.PluginSet{PluginName: &Plugin{Impl: impl}}
}
