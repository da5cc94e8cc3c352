// Package host runs out-of-process gate plugins (see plugins/sdk) and is
// itself a dispatch gate: gate type "plugin" in the registry.
//
// The host starts the binary with the SDK's handshake, offering every
// protocol version it speaks (the plugin serves the highest it knows),
// dispenses the gRPC client of the negotiated version and maps sluice's
// types onto it (remote.go), naming the plugin in every error. The binary
// is checked against gate_params.sha256 before every start, runs with an
// empty environment plus gate_params.env, and talks to the host over
// go-plugin's automatic mutual TLS.
//
// The factory validates only the host's own parameters and starts nothing, so
// that building and closing a gate to check a config costs no process. The
// plugin process starts at the first Budget (or Admit, Describe or Start); the
// forwarded gate_params are then sent to the plugin's Configure, and a
// configuration error fails the gate for good (every Budget returns it; the
// plugin is not restarted, since restarting cannot fix a config).
//
// Supervision: when the process dies, or its connection breaks
// (codes.Unavailable), the query that finds out returns an error (the
// Refresher applies the gate's failure policy, closed by default), and the
// next query after a backoff (doubling from restart_backoff up to
// restart_backoff_max, reset by a good Budget answer) starts a new process.
// Queries in between fail at once with the last error. Close kills the
// process through go-plugin's client and is idempotent.
//
// Plugin and supervisor logs go through hclog to stderr at level info; the
// plugin's own lines are rate-limited (gate_params.log_rate per second).
package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/retry"
)

// Type is the gate's registry name.
const Type = "plugin"

// describeWait bounds how long Describe waits for the plugin to start.
const describeWait = 2 * time.Second

// ErrClosed is returned by queries on a closed gate.
var ErrClosed = errors.New("plugin gate closed")

// Gate runs a plugin process and asks it for budgets.
type Gate struct {
	cfg  Config
	name string
	log  hclog.Logger

	mu       sync.Mutex
	closed   bool
	cur      *proc         // the running plugin, nil when none
	starting chan struct{} // closed when the start in progress ends; nil when none
	cfgErr   error         // permanent: the plugin refused its parameters
	lastErr  error         // why the last process died or failed to start
	retryAt  time.Time     // no start before this
	info     Info          // what the running (or last) plugin told
	wg       sync.WaitGroup

	// restarts is the wait before the next start after a failure (under
	// mu): RestartBackoff, doubling per consecutive failure.
	restarts *backoff.ExponentialBackOff

	starts, losses, startFailures atomic.Int64 // for Events
	stderr                        *rateWriter  // the plugin's relayed stderr
	calls                         [numRPC]callStats
}

// Info is what the host knows of its plugin once it has started.
type Info struct {
	// Protocol is the negotiated protocol version.
	Protocol int
	// Description is the plugin's Describe ("" when it has none).
	Description string
	// Admitter is true when the plugin implements Admit.
	Admitter bool
	// SDK names the library the plugin was built with (protocol 2 and up;
	// "" when the plugin does not say).
	SDK string
	// TLS is true when the connection runs over (mutual) TLS.
	TLS bool
	// PID is the process id (0 when none runs).
	PID int
}

// Calls returns the timings of the RPCs made to the plugin, its processes
// taken together: sluice_gate_plugin_call_seconds and
// sluice_gate_plugin_call_failures_total.
func (g *Gate) Calls() []gate.CallStats {
	out := make([]gate.CallStats, numRPC)
	for i := range numRPC {
		out[i] = g.calls[i].snapshot(rpcNames[i])
	}
	return out
}

// RegisterMetrics registers the gate's series on reg (gate.Env.Metrics,
// which labels them with the gate's name; nil: none): its RPC timings,
// sluice_gate_plugin_call_seconds{gate, rpc} and
// sluice_gate_plugin_call_failures_total{gate, rpc}, and its process
// events, sluice_gate_events_total{gate, event}.
func (g *Gate) RegisterMetrics(reg prometheus.Registerer) error {
	return gate.Register(reg, gate.CallsCollector(g.Calls), gate.EventsCollector(g.Events))
}

// Info returns what the plugin told at its last start (zero before one).
func (g *Gate) Info() Info {
	g.mu.Lock()
	defer g.mu.Unlock()
	info := g.info
	info.PID = 0
	if g.cur != nil {
		info.PID = g.cur.pid
	}
	return info
}

// Events counts the plugin's process starts, losses (a process that exited
// or stopped answering), failed starts and the stderr lines dropped by the
// log rate limit: sluice_gate_events_total.
func (g *Gate) Events() map[string]int64 {
	var suppressed int64
	if g.stderr != nil {
		suppressed = g.stderr.suppressedTotal()
	}
	return map[string]int64{
		"plugin_starts":               g.starts.Load(),
		"plugin_losses":               g.losses.Load(),
		"plugin_start_failures":       g.startFailures.Load(),
		"plugin_log_lines_suppressed": suppressed,
	}
}

// AdmitGate is a Gate that also asks the plugin per request (admit=true).
type AdmitGate struct{ *Gate }

// proc is one plugin process and the gate it serves.
type proc struct {
	client *plugin.Client
	remote *remote
	pid    int
}

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
	_ gate.Validator = (*Gate)(nil)
	_ gate.Admitter  = (*AdmitGate)(nil)
)

// Factory builds the gate from gate_params (see the Param constants). It
// returns an *AdmitGate when admit is true, else a *Gate, so that a queue
// whose plugin does not decide per request pays nothing per message.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	cfg, err := ConfigFromParams(p)
	if err != nil {
		return nil, err
	}
	g, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := g.RegisterMetrics(env.Metrics); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if cfg.Admit {
		return &AdmitGate{Gate: g}, nil
	}
	return g, nil
}

// New returns a gate for cfg (defaults applied, then validated); it starts
// nothing. cfg.Admit is recorded (the plugin must then implement Admit), but
// only an AdmitGate wrapping the result asks the plugin per request.
func New(cfg Config) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	name := filepath.Base(cfg.Path)
	g := &Gate{
		cfg:    cfg,
		name:   name,
		log:    newLogger("plugin."+name, os.Stderr),
		stderr: newRateWriter(os.Stderr, cfg.LogRate, "plugin."+name),
	}
	g.restarts = retry.Doubling(cfg.RestartBackoff, cfg.RestartBackoffMax)
	return g, nil
}

// Validate reports a plugin binary that cannot be started: missing, not a
// regular file, or not executable (a bare name is looked up in PATH, as the
// start does). `sluice validate` calls it; New does not (no I/O there).
func (g *Gate) Validate() error {
	return checkBinary(g.cfg.Path)
}

// checkBinary reports why path cannot be run as a plugin, or nil.
func checkBinary(path string) error {
	p, err := exec.LookPath(path)
	if err != nil {
		return fmt.Errorf("gate_params.%s: %w", ParamPath, err)
	}
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return fmt.Errorf("gate_params.%s: %w", ParamPath, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("gate_params.%s: %s is not a regular file", ParamPath, p)
	}
	return nil
}

// Start starts the plugin now unless it runs already, waiting at most until
// ctx ends. Queries start it on demand; Start is for callers that want a
// broken plugin or a refused configuration reported early.
func (g *Gate) Start(ctx context.Context) error {
	_, err := g.conn(ctx)
	return err
}

// PID returns the plugin process id, or 0 when none runs.
func (g *Gate) PID() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cur == nil {
		return 0
	}
	return g.cur.pid
}

// Budget asks the plugin for the current budget. A fallback the plugin
// applied itself stays a *gate.FallbackError, its failure naming the plugin.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	p, err := g.conn(ctx)
	if err != nil {
		return 0, err
	}
	b, err := p.remote.budget(ctx)
	if err != nil {
		// fb escapes (errors.As takes its address): declared here, a good
		// answer allocates nothing.
		var fb *gate.FallbackError
		if !errors.As(err, &fb) {
			return 0, g.failed(ctx, p, err)
		}
		err = &gate.FallbackError{Budget: fb.Budget, Err: g.named(fb.Err)}
	}
	g.answered()
	return b, err
}

// Admit asks the plugin to decide one request (the payload is not sent).
func (g *AdmitGate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	p, err := g.conn(ctx)
	if err != nil {
		return gate.Decision{}, err
	}
	d, err := p.remote.admit(ctx, req)
	if err != nil {
		return gate.Decision{}, g.failed(ctx, p, err)
	}
	return d, nil
}

// Describe names the plugin and adds its own description. The Refresher asks
// before the first Budget, so Describe starts the plugin when none runs yet,
// waiting at most describeWait; when that fails it names the binary only.
func (g *Gate) Describe() string {
	ctx, cancel := context.WithTimeout(context.Background(), min(g.cfg.StartTimeout, describeWait))
	defer cancel()
	_, _ = g.conn(ctx)
	g.mu.Lock()
	desc := g.info.Description
	g.mu.Unlock()
	if desc == "" {
		return "plugin " + g.cfg.Path
	}
	return fmt.Sprintf("%s (plugin %s)", desc, g.cfg.Path)
}

// Close kills the plugin process, waiting for a start in progress. It is
// idempotent; queries after Close return ErrClosed.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.closed = true
	p := g.cur
	g.cur = nil
	g.mu.Unlock()
	if p != nil {
		p.client.Kill()
	}
	g.wg.Wait()
	g.stderr.flush()
	return nil
}

// named prefixes err with the plugin's name.
func (g *Gate) named(err error) error {
	return fmt.Errorf("plugin %s: %w", g.name, err)
}
