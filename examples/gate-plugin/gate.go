package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/plugins/sdk"
)

// fileGate reads its budget from a file on every query.
type fileGate struct {
	mu         sync.RWMutex
	file       string
	deny       map[string]bool
	deferred   map[string]bool
	deferDelay time.Duration
}

var (
	_ sdk.Gate       = (*fileGate)(nil)
	_ sdk.Admitter   = (*fileGate)(nil)
	_ sdk.Describer  = (*fileGate)(nil)
	_ sdk.Configurer = (*fileGate)(nil)
)

// Configure reads the gate_params: "file" (required), "deny_tenants" and
// "defer_tenants" (comma-separated metadata.tenant values), "defer_delay"
// (default 1s).
func (g *fileGate) Configure(p sdk.Params) error {
	file := p.String("file", "")
	if file == "" {
		return fmt.Errorf("gate_params.file is required")
	}
	delay, err := p.Duration("defer_delay", time.Second)
	if err != nil {
		return err
	}
	if delay <= 0 {
		return fmt.Errorf("gate_params.defer_delay: %v is not positive", delay)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.file = file
	g.deny = set(p.String("deny_tenants", ""))
	g.deferred = set(p.String("defer_tenants", ""))
	g.deferDelay = delay
	return nil
}

func set(list string) map[string]bool {
	out := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out[s] = true
		}
	}
	return out
}

// Budget returns the number in the file.
func (g *fileGate) Budget(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	g.mu.RLock()
	file := g.file
	g.mu.RUnlock()
	if file == "" {
		return 0, fmt.Errorf("not configured")
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read budget: %w", err)
	}
	b, err := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	if err != nil {
		return 0, fmt.Errorf("budget file %s: %w", file, err)
	}
	if b != b || b < 0 || b > 1 {
		return 0, fmt.Errorf("budget file %s: %v outside [0,1]", file, b)
	}
	return b, nil
}

// Admit rejects denied tenants and defers deferred ones.
func (g *fileGate) Admit(ctx context.Context, req *sdk.Request) (sdk.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sdk.Decision{}, err
	}
	tenant := req.Metadata["tenant"]
	g.mu.RLock()
	defer g.mu.RUnlock()
	switch {
	case g.deny[tenant]:
		return sdk.Decision{Verdict: sdk.Reject, Reason: "tenant " + tenant + " is denied"}, nil
	case g.deferred[tenant]:
		return sdk.Decision{Verdict: sdk.Defer, Delay: g.deferDelay, Reason: "tenant " + tenant + " is deferred"}, nil
	}
	return sdk.Admitted, nil
}

// Describe says when the gate closes.
func (g *fileGate) Describe() string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return fmt.Sprintf("when the number in %s is 0", g.file)
}
