package host_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/plugins/sdk"
)

// A plugin built for protocol v1 (testdata/v1plugin, frozen with its own
// copy of the v1 generated code) keeps working with this host: the
// handshake settles on v1, and budgets, verdicts and descriptions cross as
// they did.
func TestV1PluginWithV2Host(t *testing.T) {
	g := newGate(t, map[string]string{"path": v1Bin, "level": "0.4", "admit": "true"}).(*host.AdmitGate)
	if b, err := g.Budget(ctx(t)); err != nil || b != 0.4 {
		t.Fatalf("Budget = %v, %v; want 0.4", b, err)
	}
	info := g.Info()
	if info.Protocol != sdk.ProtocolV1 || info.Description != "v1 plugin at level 0.4" || !info.Admitter || info.SDK != "" || !info.TLS {
		t.Errorf("info %+v; want protocol 1, the plugin's description, an admitter, TLS", info)
	}
	tests := []struct {
		tenant  string
		want    gate.Decision
		wantErr string
	}{
		{"a", gate.Admitted, ""},
		{"blocked", gate.Decision{Verdict: gate.Reject, Reason: "blocked by v1"}, ""},
		{"later", gate.Decision{Verdict: gate.Defer, Delay: 100 * time.Millisecond, Reason: "later"}, ""},
		{"bogus", gate.Decision{}, "unknown verdict 3 for protocol version 1"},
	}
	for _, tt := range tests {
		req := &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute), Metadata: map[string]string{"tenant": tt.tenant},
			Labels: map[string]string{"tier": "batch"}}
		d, err := g.Admit(ctx(t), req)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("tenant %s: Admit = %+v, %v; want an error containing %q", tt.tenant, d, err, tt.wantErr)
			}
			continue
		}
		if err != nil || d.Verdict != tt.want.Verdict || d.Delay != tt.want.Delay || d.Reason != tt.want.Reason {
			t.Errorf("tenant %s: Admit = %+v, %v; want %+v", tt.tenant, d, err, tt.want)
		}
		if len(req.Labels) != 1 || req.Labels["tier"] != "batch" {
			t.Errorf("tenant %s: labels %v changed by a v1 plugin", tt.tenant, req.Labels)
		}
	}
	// An unknown verdict is a failed query, not a broken plugin.
	if pid := g.PID(); pid != info.PID || pid == 0 {
		t.Errorf("PID %d, was %d: the plugin was restarted", pid, info.PID)
	}
}

// A plugin built with this SDK speaks v2: it can answer Wait and label the
// request, and tells its capabilities.
func TestV2WaitAndLabels(t *testing.T) {
	g := newGate(t, map[string]string{"path": testBin, "args": "wait", "admit": "true"}).(*host.AdmitGate)
	req := &wire.Request{ID: "w", Deadline: time.Now().Add(time.Minute), Labels: map[string]string{"tier": "batch", "drop": "x"}}
	d, err := g.Admit(ctx(t), req)
	if err != nil || d.Verdict != gate.Wait || d.Delay != 50*time.Millisecond || d.Reason != "pool full" {
		t.Fatalf("Admit = %+v, %v; want Wait 50ms", d, err)
	}
	if req.Label("classification") != "overflow" || req.Label("tier") != "batch" || req.Label("drop") != "" || len(req.Labels) != 2 {
		t.Errorf("labels %v; want classification=overflow set, drop removed, tier kept", req.Labels)
	}
	info := g.Info()
	if info.Protocol != sdk.ProtocolV2 || !info.Admitter || !strings.HasPrefix(info.SDK, "sluice-sdk-go") || !info.TLS {
		t.Errorf("info %+v; want protocol 2, an admitter, the Go SDK, TLS", info)
	}
	// Every RPC made is timed.
	calls := map[string]gate.CallStats{}
	for _, c := range g.Calls() {
		calls[c.Call] = c
	}
	for call, min := range map[string]uint64{"configure": 1, "describe": 1, "admit": 1} {
		if c := calls[call]; c.Count < min || c.Seconds <= 0 || c.Failures != 0 {
			t.Errorf("%s: %+v; want ≥ %d timed calls without failures", call, c, min)
		}
	}
}
