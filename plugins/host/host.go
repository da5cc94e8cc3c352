// Package host runs out-of-process gate plugins (see plugins/sdk) and is
// itself a dispatch gate: gate type "plugin" in the registry.
//
// The factory validates only the host's own parameters and starts nothing, so
// that building and closing a gate to check a config costs no process. The
// plugin process starts at the first Budget (or Admit, Describe or Start); the
// forwarded gate_params are then sent to the plugin's Configure, and a
// configuration error fails the gate for good (every Budget returns it; the
// plugin is not restarted, since restarting cannot fix a config).
//
// Supervision: when the process dies, or its connection breaks, the query
// that finds out returns an error (the Refresher applies the gate's failure
// policy, closed by default), and the next query after a backoff (doubling
// from restart_backoff up to restart_backoff_max, reset by a successful
// answer) starts a new process. Queries in between fail at once with the last
// error. Close kills the process through go-plugin's client and is idempotent.
//
// Plugin and supervisor logs go through hclog to stderr at level info.
package host

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	gatepb "github.com/sluice-io/sluice/plugins/gatepb"
	"github.com/sluice-io/sluice/plugins/sdk"
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
	failures int           // consecutive failures, for the backoff
	desc     string        // the plugin's Describe, once known
	wg       sync.WaitGroup
}

// AdmitGate is a Gate that also asks the plugin per request (admit=true).
type AdmitGate struct{ *Gate }

// proc is one plugin process.
type proc struct {
	client *plugin.Client
	rpc    gatepb.GateClient
	pid    int
}

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
	_ gate.Admitter  = (*AdmitGate)(nil)
)

// Factory builds the gate from gate_params (see the Param constants). It
// returns an *AdmitGate when admit is true, else a *Gate, so that a queue
// whose plugin does not decide per request pays nothing per message.
func Factory(p gate.Params, _ gate.Env) (gate.Gate, error) {
	cfg, err := ConfigFromParams(p)
	if err != nil {
		return nil, err
	}
	g, err := New(cfg)
	if err != nil {
		return nil, err
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
	return &Gate{
		cfg:  cfg,
		name: name,
		log: hclog.New(&hclog.LoggerOptions{
			Name:   "plugin." + name,
			Level:  hclog.Info,
			Output: os.Stderr,
		}),
	}, nil
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

// Budget asks the plugin for the current budget.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	p, err := g.conn(ctx)
	if err != nil {
		return 0, err
	}
	resp, err := p.rpc.Budget(ctx, &gatepb.BudgetRequest{})
	if err != nil {
		return 0, g.rpcFailed(ctx, p, "budget", err)
	}
	g.answered()
	b := resp.GetBudget()
	if math.IsNaN(b) || b < 0 || b > 1 {
		return 0, fmt.Errorf("plugin %s: budget %v outside [0,1]", g.name, b)
	}
	if fb := resp.GetFallback(); fb != "" {
		return 0, &gate.FallbackError{Budget: b, Err: fmt.Errorf("plugin %s: %s", g.name, fb)}
	}
	return b, nil
}

// Admit asks the plugin to decide one request (the payload is not sent).
func (g *AdmitGate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	p, err := g.conn(ctx)
	if err != nil {
		return gate.Decision{}, err
	}
	resp, err := p.rpc.Admit(ctx, sdk.RequestToProto(req))
	if err != nil {
		return gate.Decision{}, g.rpcFailed(ctx, p, "admit", err)
	}
	d, err := sdk.DecisionFromProto(resp)
	if err != nil {
		return gate.Decision{}, fmt.Errorf("plugin %s: admit: %w", g.name, err)
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
	desc := g.desc
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
	return nil
}

// conn returns the running plugin, starting one when none runs and the
// backoff allows it.
func (g *Gate) conn(ctx context.Context) (*proc, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		g.mu.Lock()
		switch {
		case g.closed:
			g.mu.Unlock()
			return nil, ErrClosed
		case g.cfgErr != nil:
			g.mu.Unlock()
			return nil, g.cfgErr
		}
		if p := g.cur; p != nil {
			if !p.client.Exited() {
				g.mu.Unlock()
				return p, nil
			}
			err := g.lostLocked(p, fmt.Errorf("plugin %s (pid %d) exited", g.name, p.pid))
			g.mu.Unlock()
			return nil, err
		}
		if g.starting == nil {
			if wait := time.Until(g.retryAt); wait > 0 {
				err := fmt.Errorf("%w; next start in %v", g.lastErr, wait.Round(time.Millisecond))
				g.mu.Unlock()
				return nil, err
			}
			g.starting = make(chan struct{})
			g.wg.Add(1)
			go g.start(g.starting)
		}
		ch := g.starting
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// lostLocked forgets p (the caller holds g.mu and has seen the gate open, so
// Close has not started waiting), records why and schedules the next start.
func (g *Gate) lostLocked(p *proc, err error) error {
	if g.cur == p {
		g.cur = nil
	}
	// Reap the client's goroutines in the background; Close waits for it.
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		p.client.Kill()
	}()
	g.failLocked(err)
	g.log.Warn("plugin lost; restarting after backoff", "pid", p.pid, "err", err, "backoff", time.Until(g.retryAt).Round(time.Millisecond))
	return err
}

func (g *Gate) failLocked(err error) {
	g.lastErr = err
	backoff := g.cfg.RestartBackoff << min(g.failures, 30)
	if backoff <= 0 || backoff > g.cfg.RestartBackoffMax {
		backoff = g.cfg.RestartBackoffMax
	}
	g.failures++
	g.retryAt = time.Now().Add(backoff)
}

// answered resets the backoff after a good answer.
func (g *Gate) answered() {
	g.mu.Lock()
	g.failures = 0
	g.mu.Unlock()
}

// rpcFailed wraps a failed call. A broken connection (Unavailable, or a
// process that has exited) drops the plugin so that the next query restarts it.
func (g *Gate) rpcFailed(ctx context.Context, p *proc, call string, err error) error {
	err = fmt.Errorf("plugin %s: %s: %w", g.name, call, err)
	if ctx.Err() != nil {
		return err
	}
	if status.Code(errors.Unwrap(err)) != codes.Unavailable && !p.client.Exited() {
		return err
	}
	g.mu.Lock()
	if g.cur == p {
		g.lostLocked(p, err)
	}
	g.mu.Unlock()
	return err
}

// start launches, configures and describes one plugin process.
func (g *Gate) start(done chan struct{}) {
	defer g.wg.Done()
	p, desc, cfgErr, err := g.launch()
	g.mu.Lock()
	defer func() {
		g.starting = nil
		close(done)
		g.mu.Unlock()
	}()
	switch {
	case g.closed:
		if p != nil {
			p.client.Kill()
		}
	case cfgErr != nil:
		g.cfgErr = cfgErr
		g.log.Error("plugin refused its gate_params", "err", cfgErr)
	case err != nil:
		g.failLocked(err)
		g.log.Warn("plugin failed to start", "err", err)
	default:
		g.cur = p
		g.desc = desc
		g.log.Info("plugin started", "pid", p.pid)
	}
}

// launch runs the binary and performs the Configure and Describe calls. It
// returns a configuration error separately: it is permanent.
func (g *Gate) launch() (p *proc, desc string, cfgErr, err error) {
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		Plugins:          sdk.PluginSet(nil),
		Cmd:              exec.Command(g.cfg.Path, g.cfg.Args...),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     g.cfg.StartTimeout,
		Logger:           g.log,
	})
	fail := func(e error) (*proc, string, error, error) {
		client.Kill()
		return nil, "", nil, fmt.Errorf("start plugin %s: %w", g.cfg.Path, e)
	}
	cp, err := client.Client()
	if err != nil {
		return fail(err)
	}
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		return fail(err)
	}
	rpc, ok := raw.(gatepb.GateClient)
	if !ok {
		return fail(fmt.Errorf("dispensed %T, not a gate client", raw))
	}
	pid := 0
	if rc := client.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	p = &proc{client: client, rpc: rpc, pid: pid}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.StartTimeout)
	defer cancel()
	cresp, err := rpc.Configure(ctx, &gatepb.ConfigureRequest{Params: g.cfg.Params})
	if err != nil {
		return fail(fmt.Errorf("configure: %w", err))
	}
	if e := cresp.GetError(); e != "" {
		client.Kill()
		return nil, "", fmt.Errorf("plugin %s: %s", g.name, e), nil
	}
	if g.cfg.Admit && !cresp.GetAdmitter() {
		client.Kill()
		return nil, "", fmt.Errorf("plugin %s: gate_params.%s is true but the plugin does not implement Admit", g.name, ParamAdmit), nil
	}
	dresp, err := rpc.Describe(ctx, &gatepb.DescribeRequest{})
	if err != nil {
		return fail(fmt.Errorf("describe: %w", err))
	}
	return p, strings.TrimSpace(dresp.GetDescription()), nil, nil
}
