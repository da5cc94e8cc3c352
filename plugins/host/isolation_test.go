package host_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/plugins/host"
)

func digest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// copyFile copies src to dst, executable.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst+".tmp", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dst+".tmp", dst); err != nil { // a new inode: a running process keeps the old one
		t.Fatal(err)
	}
}

// A pinned binary runs; another binary at the same path is refused with
// both digests named, at the first start and at a restart.
func TestSHA256Pin(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gate")
	copyFile(t, testBin, bin)
	want := digest(t, testBin)
	other := digest(t, v1Bin)

	g := newGate(t, map[string]string{"path": bin, "sha256": strings.ToUpper(want)}).(*host.Gate)
	if b, err := g.Budget(ctx(t)); err != nil || b != 1 {
		t.Fatalf("pinned binary: Budget = %v, %v", b, err)
	}
	// Swap the binary, then kill the process: the restart is refused.
	copyFile(t, v1Bin, bin)
	if err := syscall.Kill(g.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err = g.Budget(ctx(t)); err != nil && strings.Contains(err.Error(), "refusing to run it") {
			break
		}
	}
	for _, s := range []string{"has sha256 " + other, "gate_params.sha256 pins " + want, bin} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("restart with a swapped binary: %v; want an error containing %q", err, s)
		}
	}
	if ev := g.Events(); ev["plugin_start_failures"] < 1 || ev["plugin_starts"] != 1 {
		t.Errorf("events %v; want one start and refused restarts", ev)
	}

	// A wrong pin from the start.
	g2 := newGate(t, map[string]string{"path": testBin, "sha256": other}).(*host.Gate)
	if err := g2.Start(ctx(t)); err == nil || !strings.Contains(err.Error(), "has sha256 "+want) || g2.PID() != 0 {
		t.Errorf("mismatched pin: Start = %v, PID %d; want a refusal naming the actual digest", err, g2.PID())
	}
	// A malformed pin is a config error.
	if _, err := host.Factory(gate.NewParams(map[string]string{"path": testBin, "sha256": "abc"}), gate.Env{}); err == nil ||
		!strings.Contains(err.Error(), "not a SHA-256 digest") {
		t.Errorf("malformed sha256: %v", err)
	}
}

// The plugin starts with an empty environment plus gate_params.env, and
// talks to the host over mutual TLS.
func TestEnvironmentAndTLS(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://:secret@127.0.0.1:6379/0")
	t.Setenv("PASSED", "from-sluice")
	g := newGate(t, map[string]string{"path": testBin, "args": "env", "env": `["PASSED", "SET=given", "ABSENT_IN_SLUICE"]`}).(*host.Gate)
	if err := g.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	info := g.Info()
	want := "REDIS_URL unset; PASSED=from-sluice; SET=given; PLUGIN_CLIENT_CERT set"
	if info.Description != want {
		t.Errorf("the plugin saw %q, want %q", info.Description, want)
	}
	if !info.TLS {
		t.Error("the connection to the plugin is not TLS")
	}
	for _, bad := range []string{`["=x"]`, `["A B=1"]`} {
		if _, err := host.Factory(gate.NewParams(map[string]string{"path": testBin, "env": bad}), gate.Env{}); err == nil {
			t.Errorf("env %s accepted", bad)
		}
	}
}

// A plugin that floods its stderr is relayed at log_rate lines a second;
// the rest is counted.
func TestLogRate(t *testing.T) {
	g := newGate(t, map[string]string{"path": testBin, "args": "flood", "log_rate": "10"}).(*host.Gate)
	for range 3 {
		if _, err := g.Budget(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	// The lines travel through a pipe: wait for them.
	deadline := time.Now().Add(5 * time.Second)
	for g.Events()["plugin_log_lines_suppressed"] < 250 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := g.Events()["plugin_log_lines_suppressed"]; n < 250 || n > 300 {
		t.Errorf("%d of 300 lines suppressed at log_rate 10; want 250 to 290 or so", n)
	}
}

// A plugin that panics is logged at error, its panic and the trace after
// it: the runtime writes them to the process's own stderr, which go-plugin
// (v1.6) would log at debug only. go-plugin's own start lines are not.
func TestPanicReachesLog(t *testing.T) {
	g := newGate(t, map[string]string{"path": testBin, "args": "panic"}).(*host.Gate)
	var out testenv.Buffer
	host.SetLogOutput(g, &out)
	if _, err := g.Budget(ctx(t)); err == nil {
		t.Fatal("Budget of a plugin that panics succeeded")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "[ERROR] plugin.testplugin: goroutine ") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	log := out.String()
	for _, want := range []string{"[ERROR] plugin.testplugin: panic: planted panic", "[ERROR] plugin.testplugin: goroutine "} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// go-plugin v1.6's start lines are at debug (quietLogger), below the log's level.
	if strings.Contains(log, "automatic mTLS") {
		t.Errorf("a start line of go-plugin logged above debug:\n%s", log)
	}
}
