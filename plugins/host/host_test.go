package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/plugins/host"
)

// pluginBin is the example plugin (its own module, examples/gate-plugin),
// testBin the test plugin (testdata/testplugin) and v1Bin a plugin frozen
// at protocol version 1 (testdata/v1plugin), built once by TestMain.
var pluginBin, testBin, v1Bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-gateplugin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginBin = filepath.Join(dir, "gateplugin")
	testBin = filepath.Join(dir, "testplugin")
	v1Bin = filepath.Join(dir, "v1plugin")
	for _, b := range []struct{ bin, dir, pkg string }{
		{pluginBin, "../../examples/gate-plugin", "."}, // a module of its own: built from its folder
		{testBin, ".", "./testdata/testplugin"},
		{v1Bin, ".", "./testdata/v1plugin"},
	} {
		build := exec.Command("go", "build", "-o", b.bin, b.pkg)
		build.Dir = b.dir
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		pkg := b.pkg
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg+":", err)
			_ = os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		// The end-to-end test links the whole app: the Pub/Sub client's
		// OpenCensus import starts a worker in an init function.
		if err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// budgetFile writes b into a fresh file and returns its path.
func budgetFile(t testing.TB, b string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "budget")
	if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// newGate builds a plugin gate through the factory and closes it at cleanup.
func newGate(t testing.TB, vals map[string]string) gate.Gate {
	t.Helper()
	p := map[string]string{"path": pluginBin, "restart_backoff": "50ms"}
	for k, v := range vals {
		p[k] = v
	}
	g, err := host.Factory(gate.NewParams(p), gate.Env{})
	if err != nil {
		t.Fatalf("Factory: %v", err)
	}
	t.Cleanup(func() { _ = g.(interface{ Close() error }).Close() })
	return g
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestConformance(t *testing.T) {
	for _, admit := range []string{"false", "true"} {
		t.Run("admit="+admit, func(t *testing.T) {
			file := budgetFile(t, "1")
			gatetest.Run(t, func(t testing.TB) gate.Gate {
				return newGate(t, map[string]string{"file": file, "admit": admit})
			}, gatetest.Features{
				Set: func(t testing.TB, b float64) {
					if err := os.WriteFile(file, []byte(fmt.Sprint(b)), 0o600); err != nil {
						t.Fatal(err)
					}
				},
				Failing: func(t testing.TB) gate.Gate {
					return newGate(t, map[string]string{"file": filepath.Join(t.TempDir(), "missing"), "admit": admit})
				},
				Hanging: func(t testing.TB) gate.Gate {
					return newGate(t, map[string]string{"path": testBin, "args": "hang", "admit": admit})
				},
			})
		})
	}
}

func TestFactoryParams(t *testing.T) {
	tests := []struct {
		name    string
		vals    map[string]string
		wantErr string
	}{
		{"no path", map[string]string{"file": "x"}, "path is required"},
		{"bad admit", map[string]string{"path": "p", "admit": "maybe"}, "not true or false"},
		{"bad args", map[string]string{"path": "p", "args": `["a", 1]`}, "JSON array"},
		{"bad backoff", map[string]string{"path": "p", "restart_backoff": "soon"}, "not a duration"},
		{"backoff above max", map[string]string{"path": "p", "restart_backoff": "1m", "restart_backoff_max": "1s"}, "below"},
		// No I/O at construction: a missing binary is found at start.
		{"missing binary ok", map[string]string{"path": "/nonexistent/plugin"}, ""},
		{"plugin params ok", map[string]string{"path": "p", "file": "f", "anything": "1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := host.Factory(gate.NewParams(tt.vals), gate.Env{})
			if g != nil {
				defer g.(interface{ Close() error }).Close()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Factory: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Factory error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	tests := []struct {
		raw  map[string]json.RawMessage
		want []string
	}{
		{map[string]json.RawMessage{"path": []byte(`"p"`)}, nil},
		{map[string]json.RawMessage{"path": []byte(`"p"`), "args": []byte(`"-v  --x=1"`)}, []string{"-v", "--x=1"}},
		{map[string]json.RawMessage{"path": []byte(`"p"`), "args": []byte(`["a b", "c"]`)}, []string{"a b", "c"}},
		{map[string]json.RawMessage{"path": []byte(`"p"`), "args": []byte(`"[\"x y\"]"`)}, []string{"x y"}},
	}
	for _, tt := range tests {
		p, err := gate.ParseParams(tt.raw)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := host.ConfigFromParams(p)
		if err != nil {
			t.Fatalf("%s: %v", tt.raw["args"], err)
		}
		if fmt.Sprint(cfg.Args) != fmt.Sprint(tt.want) || len(cfg.Params) != 0 {
			t.Errorf("%s: args %q params %v, want %q and none", tt.raw["args"], cfg.Args, cfg.Params, tt.want)
		}
	}
}

// The plugin validates the parameters forwarded to it; its verdict is
// permanent (no restart loop on a bad config).
func TestPluginRefusesParams(t *testing.T) {
	tests := []struct {
		name string
		vals map[string]string
		want string
	}{
		{"unknown", map[string]string{"file": "f", "bogus": "1"}, "unknown gate_params: bogus"},
		{"missing required", nil, "gate_params.file is required"},
		{"invalid", map[string]string{"file": "f", "defer_delay": "-1s"}, "defer_delay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(t, tt.vals).(*host.Gate)
			err := g.Start(ctx(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start error %v, want one containing %q", err, tt.want)
			}
			if _, err2 := g.Budget(ctx(t)); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("Budget after a refused config: %v, want %v", err2, err)
			}
			if pid := g.PID(); pid != 0 {
				t.Errorf("PID %d after a refused config, want no process", pid)
			}
		})
	}
}

// Through the registry, the generic parameters stay in the host.
func TestRegistryKeepsGenericParams(t *testing.T) {
	r := gate.NewRegistry()
	if err := r.Register(host.Type, host.Factory); err != nil {
		t.Fatal(err)
	}
	g, err := r.New(host.Type, gate.NewParams(map[string]string{
		"path": pluginBin, "file": budgetFile(t, "0.5"), "failure_policy": "open", "refresh_interval": "100ms",
	}), gate.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.(interface{ Close() error }).Close()
	if b, err := g.Budget(ctx(t)); err != nil || b != 0.5 {
		t.Fatalf("Budget = %v, %v; want 0.5", b, err)
	}
	if p := gate.PolicyOf(g); p != gate.FailOpen {
		t.Errorf("policy %q, want open", p)
	}
	if d := g.(gate.Describer).Describe(); !strings.Contains(d, "budget") || !strings.Contains(d, pluginBin) {
		t.Errorf("Describe = %q", d)
	}
}

func TestAdmitRoundTrip(t *testing.T) {
	g := newGate(t, map[string]string{
		"file": budgetFile(t, "1"), "admit": "true", "deny_tenants": "a", "defer_tenants": "b", "defer_delay": "250ms",
	})
	adm, ok := g.(gate.Admitter)
	if !ok {
		t.Fatalf("%T with admit=true is not an Admitter", g)
	}
	if _, ok := newGate(t, map[string]string{"file": "f"}).(gate.Admitter); ok {
		t.Error("gate with admit=false is an Admitter; the per-message path should not call the plugin")
	}
	tests := []struct {
		tenant string
		want   gate.Decision
	}{
		{"a", gate.Decision{Verdict: gate.Reject, Reason: "tenant a is denied"}},
		{"b", gate.Decision{Verdict: gate.Defer, Delay: 250 * time.Millisecond, Reason: "tenant b is deferred"}},
		{"c", gate.Admitted},
	}
	for _, tt := range tests {
		req := &wire.Request{
			ID: "r-" + tt.tenant, Deadline: time.Now().Add(time.Minute), Payload: json.RawMessage(`{}`),
			Metadata: map[string]string{"tenant": tt.tenant}, Headers: map[string]string{"X-A": "1"}, Endpoint: "/v1/x",
		}
		d, err := adm.Admit(ctx(t), req)
		if err != nil || d.Verdict != tt.want.Verdict || d.Delay != tt.want.Delay || d.Reason != tt.want.Reason {
			t.Errorf("tenant %s: Admit = %+v, %v; want %+v", tt.tenant, d, err, tt.want)
		}
	}
}

// Killing the plugin process makes Budget fail, then the host restarts it.
func TestCrashAndRestart(t *testing.T) {
	g := newGate(t, map[string]string{"file": budgetFile(t, "0.75")}).(*host.Gate)
	if b, err := g.Budget(ctx(t)); err != nil || b != 0.75 {
		t.Fatalf("Budget = %v, %v", b, err)
	}
	pid := g.PID()
	if pid <= 0 {
		t.Fatalf("PID = %d", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var failed bool
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := g.Budget(ctx(t))
		if err != nil {
			failed = true
		} else if failed && b == 0.75 {
			if np := g.PID(); np == pid || np <= 0 {
				t.Fatalf("recovered with PID %d (killed %d)", np, pid)
			}
			if ev := g.Events(); ev["plugin_starts"] != 2 || ev["plugin_losses"] != 1 || ev["plugin_start_failures"] != 0 {
				t.Errorf("events %v, want 2 starts and 1 loss", ev)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("after kill: saw an error %v, but no recovery within 10s", failed)
}

// A missing binary is a start failure, retried with backoff (not permanent).
func TestMissingBinary(t *testing.T) {
	g, err := host.New(host.Config{Path: filepath.Join(t.TempDir(), "nope"), RestartBackoff: time.Hour, RestartBackoffMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, err = g.Budget(ctx(t))
	if err == nil || !strings.Contains(err.Error(), "start plugin") {
		t.Fatalf("Budget = %v, want a start error", err)
	}
	start := time.Now()
	_, err2 := g.Budget(ctx(t))
	if err2 == nil || !strings.Contains(err2.Error(), "next start in") || time.Since(start) > 100*time.Millisecond {
		t.Errorf("second Budget = %v after %v, want a prompt backoff error", err2, time.Since(start))
	}
	if ev := g.Events(); ev["plugin_start_failures"] != 1 || ev["plugin_starts"] != 0 {
		t.Errorf("events %v, want 1 failed start (the second query waits for the backoff)", ev)
	}
}

func TestCloseKillsProcess(t *testing.T) {
	g := newGate(t, map[string]string{"file": budgetFile(t, "1")}).(*host.Gate)
	if err := g.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	pid := g.PID()
	for i := range 2 {
		if err := g.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if _, err := g.Budget(ctx(t)); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Budget after Close = %v, want ErrClosed", err)
	}
	if err := g.Start(ctx(t)); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	// The process is gone (reaped by go-plugin, so signal 0 fails).
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("plugin process %d still exists after Close", pid)
	}
}

// A plugin that runs past the caller's deadline fails that query only: the
// deadline crosses the boundary, and the process is not restarted.
func TestHangingPluginKeepsRunning(t *testing.T) {
	g := newGate(t, map[string]string{"path": testBin, "args": `["hang"]`, "admit": "true"})
	if err := g.(*host.AdmitGate).Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	pid := g.(*host.AdmitGate).PID()
	for range 3 {
		c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		start := time.Now()
		_, err := g.Budget(c)
		_, aerr := g.(gate.Admitter).Admit(c, &wire.Request{ID: "x", Deadline: time.Now().Add(time.Minute)})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(fmt.Sprint(err), "DeadlineExceeded") {
			t.Errorf("Budget = %v, want a deadline error", err)
		}
		if aerr == nil {
			t.Error("hanging Admit returned no error")
		}
		if el := time.Since(start); el > time.Second {
			t.Errorf("hanging queries took %v", el)
		}
	}
	if np := g.(*host.AdmitGate).PID(); np != pid {
		t.Errorf("PID %d → %d: a slow plugin was restarted", pid, np)
	}
}

// A plugin that keeps dying is restarted with a doubling backoff.
func TestCrashLoopBackoff(t *testing.T) {
	g, err := host.New(host.Config{Path: testBin, Args: []string{"exit"}, RestartBackoff: 40 * time.Millisecond, RestartBackoffMax: 160 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var starts []time.Time
	deadline := time.Now().Add(10 * time.Second)
	for len(starts) < 5 && time.Now().Before(deadline) {
		before := g.PID()
		_, err := g.Budget(ctx(t))
		if err == nil {
			t.Fatal("Budget of a dying plugin succeeded")
		}
		if !strings.Contains(err.Error(), "next start in") && before == 0 {
			starts = append(starts, time.Now()) // this query started a process
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(starts) < 5 {
		t.Fatalf("%d starts in 10s", len(starts))
	}
	// Gaps follow the backoff: 40, 80, 160, 160 ms (plus start-up time).
	for i, want := range []time.Duration{40, 80, 160, 160} {
		gap := starts[i+1].Sub(starts[i])
		if gap < want*time.Millisecond {
			t.Errorf("restart %d came %v after the previous, want ≥ %v", i+1, gap, want*time.Millisecond)
		}
	}
}
