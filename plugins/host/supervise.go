package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/sluice-io/sluice/plugins/sdk"
	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

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

// failed names the plugin in the error of a query on p. A broken connection
// (errUnavailable, or a process that has exited) drops the plugin so that
// the next query restarts it; any other error fails this query only.
func (g *Gate) failed(ctx context.Context, p *proc, err error) error {
	err = g.named(err)
	if ctx.Err() != nil {
		return err
	}
	if !errors.Is(err, errUnavailable) && !p.client.Exited() {
		return err
	}
	g.mu.Lock()
	if g.cur == p {
		g.lostLocked(p, err)
	}
	g.mu.Unlock()
	return err
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
	g.losses.Add(1)
	g.failLocked(err)
	g.log.Warn("plugin lost; restarting after backoff", "pid", p.pid, "err", err, "backoff", time.Until(g.retryAt).Round(time.Millisecond))
	return err
}

// failLocked records a failed start or a lost process and sets the next
// start time: RestartBackoff after the first failure, doubling per
// consecutive failure up to RestartBackoffMax.
func (g *Gate) failLocked(err error) {
	g.lastErr = err
	g.retryAt = time.Now().Add(g.restarts.NextBackOff())
}

// answered resets the backoff after a good answer.
func (g *Gate) answered() {
	g.mu.Lock()
	g.restarts.Reset()
	g.mu.Unlock()
}

// start launches one plugin process and publishes the outcome.
func (g *Gate) start(done chan struct{}) {
	defer g.wg.Done()
	p, info, cfgErr, err := g.launch()
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
		g.startFailures.Add(1)
		g.failLocked(err)
		g.log.Warn("plugin failed to start", "err", err)
	default:
		g.starts.Add(1)
		g.cur = p
		g.info = info
		g.log.Info("plugin started", "pid", p.pid, "protocol", info.Protocol, "tls", info.TLS, "sdk", info.SDK)
	}
}

// launch checks the binary's digest, runs it with its own environment,
// dispenses its gate and performs the Configure and Describe calls, bounded
// by the start timeout. It returns a configuration error separately: it is
// permanent.
func (g *Gate) launch() (p *proc, info Info, cfgErr, err error) {
	cmd := exec.Command(g.cfg.Path, g.cfg.Args...)
	cmd.Env = g.cfg.environ(os.LookupEnv)
	var pin *pinnedHash
	var secure *plugin.SecureConfig
	if g.cfg.SHA256 != "" {
		want, _ := hex.DecodeString(g.cfg.SHA256) // Validate checked it
		pin = &pinnedHash{Hash: sha256.New()}
		secure = &plugin.SecureConfig{Checksum: want, Hash: pin}
	}
	logger := quietLogger{newLogger("plugin", g.stderr)}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		VersionedPlugins: sdk.ClientPlugins(),
		Cmd:              cmd,
		SkipHostEnv:      true,
		SecureConfig:     secure,
		AutoMTLS:         true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     g.cfg.StartTimeout,
		Logger:           logger,
		SyncStderr:       lineRelay(logger.Named(g.name)),
		Stderr:           crashRelay(logger.Named(g.name)),
	})
	fail := func(e error) (*proc, Info, error, error) {
		client.Kill()
		return nil, Info{}, nil, fmt.Errorf("start plugin %s: %w", g.cfg.Path, e)
	}
	refuse := func(e error) (*proc, Info, error, error) {
		client.Kill()
		return nil, Info{}, g.named(e), nil
	}
	cp, err := client.Client()
	if errors.Is(err, plugin.ErrChecksumsDoNotMatch) && pin != nil {
		return fail(fmt.Errorf("binary has sha256 %x, but gate_params.%s pins %s: refusing to run it", pin.sum, ParamSHA256, g.cfg.SHA256))
	}
	if err != nil {
		return fail(err)
	}
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		return fail(err)
	}
	rpc, ok := raw.(gatepb.GateClient)
	if !ok {
		return fail(fmt.Errorf("dispensed %T, not a gatepb.GateClient", raw))
	}
	r := &remote{rpc: rpc, version: client.NegotiatedVersion(), stats: &g.calls}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.StartTimeout)
	defer cancel()
	admitter, tls, err := r.configure(ctx, g.cfg.Params)
	switch {
	case errors.Is(err, ErrRefused):
		return refuse(err)
	case err != nil:
		return fail(err)
	case g.cfg.Admit && !admitter:
		return refuse(fmt.Errorf("gate_params.%s is true but the plugin does not implement Admit", ParamAdmit))
	}
	d, err := r.describe(ctx)
	if err != nil {
		return fail(err)
	}
	pid := 0
	if rc := client.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	info = Info{Protocol: r.version, Description: strings.TrimSpace(d.description), Admitter: admitter, SDK: d.sdk, TLS: tls}
	return &proc{client: client, remote: r, pid: pid}, info, nil, nil
}

// pinnedHash is the hash go-plugin's SecureConfig checks the binary with;
// it keeps the digest it computed, so a mismatch can name it.
type pinnedHash struct {
	hash.Hash
	sum []byte
}

// Sum records the digest.
func (h *pinnedHash) Sum(b []byte) []byte {
	h.sum = h.Hash.Sum(nil)
	return append(b, h.sum...)
}
