package host

import (
	"context"
	"time"
)

// Probed is what Probe learns about a plugin binary.
type Probed struct {
	// Info is what the plugin told at its start; PID is the process that
	// answered (0 if it died right after starting), which has exited when
	// Probe returns.
	Info
	// Path is the binary.
	Path string
	// Startup is how long the start took: process, handshake, Configure and
	// Describe.
	Startup time.Duration
}

// Probe starts the plugin cfg names, the way a queue's gate does (same
// pin, environment, handshake, arguments and Configure with cfg.Params),
// learns what it implements and stops it. cfg.Admit is ignored: the plugin
// says in Configure whether it implements Admit. A plugin that fails to
// start or refuses its parameters is an error; the rest of cfg's defaults
// apply as in New.
func Probe(ctx context.Context, cfg Config) (Probed, error) {
	cfg.Admit = false
	g, err := New(cfg)
	if err != nil {
		return Probed{}, err
	}
	defer g.Close()
	start := time.Now()
	if err := g.Start(ctx); err != nil {
		return Probed{}, err
	}
	return Probed{Info: g.Info(), Path: g.cfg.Path, Startup: time.Since(start)}, nil
}
