package host

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Info is what Probe learns about a plugin binary.
type Info struct {
	// Path is the binary.
	Path string
	// PID is the process that answered (it has exited when Probe returns).
	PID int
	// Protocol is the plugin protocol version host and plugin agreed on in
	// go-plugin's handshake.
	Protocol int
	// Admitter is true when the plugin implements Admit.
	Admitter bool
	// Description is the plugin's own one-line Describe, "" when it has none.
	Description string
	// Startup is how long the start took: process, handshake, Configure and
	// Describe (the last start, when Probe needed two).
	Startup time.Duration
}

// errNoAdmit is the end of the refusal launch returns for admit=true when
// the plugin has no Admit; Probe recognises it to learn what the plugin
// implements.
const errNoAdmit = "the plugin does not implement Admit"

// Probe starts the plugin cfg names, the way a queue's gate does (same
// handshake, arguments and Configure with cfg.Params), learns what it
// implements and stops it. cfg.Admit is ignored: Probe first starts the
// plugin asking for Admit and, when the plugin refuses because it has none,
// starts it once more without. A plugin that fails to start or refuses its
// parameters is an error; the rest of cfg's defaults apply as in New.
func Probe(ctx context.Context, cfg Config) (Info, error) {
	cfg.Admit = true
	info, err := probeOnce(ctx, cfg)
	if err != nil && strings.Contains(err.Error(), errNoAdmit) {
		cfg.Admit = false
		info, err = probeOnce(ctx, cfg)
	}
	return info, err
}

// probeOnce starts one process with cfg and reads what it reported.
func probeOnce(ctx context.Context, cfg Config) (Info, error) {
	g, err := New(cfg)
	if err != nil {
		return Info{}, err
	}
	defer g.Close()
	start := time.Now()
	if err := g.Start(ctx); err != nil {
		return Info{}, err
	}
	info := Info{Path: g.cfg.Path, Admitter: cfg.Admit, Startup: time.Since(start)}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.cur
	if p == nil {
		return Info{}, fmt.Errorf("plugin %s exited right after starting", g.name)
	}
	info.PID = p.pid
	info.Protocol = p.client.NegotiatedVersion()
	info.Description = g.desc
	return info, nil
}
