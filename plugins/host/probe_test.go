package host_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-io/sluice/plugins/host"
)

func TestProbe(t *testing.T) {
	budgetOnly := filepath.Join(t.TempDir(), "badplugin")
	if out, err := exec.Command("go", "build", "-o", budgetOnly, "./testdata/badplugin").CombinedOutput(); err != nil {
		t.Fatalf("build badplugin: %v\n%s", err, out)
	}
	file := budgetFile(t, "1")
	tests := []struct {
		name     string
		cfg      host.Config
		admitter bool
		desc     string
		protocol int
		wantErr  string
	}{
		{"admitter with a description", host.Config{Path: pluginBin, Params: map[string]string{"file": file}}, true, "when the number in " + file + " is 0", 2, ""},
		{"test plugin", host.Config{Path: testBin}, true, "test plugin", 2, ""},
		{"budget only", host.Config{Path: budgetOnly, Args: []string{"budget-only"}}, false, "", 2, ""},
		{"protocol v1", host.Config{Path: v1Bin, Params: map[string]string{"level": "0.5"}}, true, "v1 plugin at level 0.5", 1, ""},
		{"refused params", host.Config{Path: testBin, Params: map[string]string{"x": "1"}}, false, "", 0, "unknown gate_params: x"},
		{"missing binary", host.Config{Path: filepath.Join(t.TempDir(), "nope")}, false, "", 0, "start plugin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := host.Probe(ctx(t), tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Probe = %+v, %v; want an error containing %q", info, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if info.Admitter != tt.admitter || info.Description != tt.desc || info.Protocol != tt.protocol || !info.TLS ||
				info.PID <= 0 || info.Path != tt.cfg.Path || info.Startup <= 0 {
				t.Errorf("Probe = %+v; want admitter %v, description %q, protocol %d, TLS, a pid and a start-up time",
					info, tt.admitter, tt.desc, tt.protocol)
			}
			// The process is gone (reaped by go-plugin, so signal 0 fails).
			if err := syscall.Kill(info.PID, 0); err == nil {
				t.Errorf("plugin process %d still runs after Probe", info.PID)
			}
		})
	}
}
