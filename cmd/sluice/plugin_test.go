package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// pluginDir holds the test plugins, built once by buildPlugins and removed
// by TestMain.
var (
	pluginOnce sync.Once
	pluginDir  string
	pluginErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pluginDir != "" {
		_ = os.RemoveAll(pluginDir)
	}
	// Fail the package when a test leaves a goroutine behind (a serve run
	// in process, its fronts, the demo's pool). The Pub/Sub client links
	// opencensus, whose init starts a worker that never ends.
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildPlugins builds the well-behaved test plugin and the misbehaving one
// of plugins/host's tests.
func buildPlugins(t *testing.T) (good, bad string) {
	t.Helper()
	pluginOnce.Do(func() {
		if pluginDir, pluginErr = os.MkdirTemp("", "sluice-plugin-cmd-"); pluginErr != nil {
			return
		}
		for _, name := range []string{"testplugin", "badplugin"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(pluginDir, name), "../../plugins/host/testdata/"+name).CombinedOutput()
			if err != nil {
				pluginErr = fmt.Errorf("build %s: %v\n%s", name, err, out)
				return
			}
		}
	})
	if pluginErr != nil {
		t.Fatal(pluginErr)
	}
	return filepath.Join(pluginDir, "testplugin"), filepath.Join(pluginDir, "badplugin")
}

// reportLine matches one property line of `sluice plugin test`.
var reportLine = regexp.MustCompile(`^(PASS|FAIL)  (\S+) +\S+`)

// statuses reads the report into property → PASS/FAIL.
func statuses(out string) map[string]string {
	got := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if m := reportLine.FindStringSubmatch(line); m != nil {
			got[m[2]] = m[1]
		}
	}
	return got
}

func TestPluginCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin binaries")
	}
	good, bad := buildPlugins(t)
	allProps := []string{
		"Starts", "RefusesUnknownParams", "Answers", "Restarts",
		"BudgetInRange", "CancelledContext", "CloseIdempotent", "Concurrent", "OptionalInterfaces", "Refresher", "Releases",
	}
	tests := []struct {
		name     string
		args     []string
		wantExit bool     // exit status 1
		wantErr  string   // an error (bad flags, a plugin that does not start)
		want     []string // in the output
		fail     []string // properties that must fail; all others must pass
	}{
		{name: "describe", args: []string{"describe", good},
			want: []string{"plugin       " + good, "protocol     2", "mutual TLS   true", "implements   Budget, Admit", "description  test plugin", "started in "}},
		{name: "describe budget only", args: []string{"describe", bad, "--args", "budget-only"},
			want: []string{"implements   Budget (no Admit: gate_params.admit must stay false)"}},
		{name: "describe refused", args: []string{"describe", good, "--params", `{"limit": 0.5}`},
			wantErr: "unknown gate_params: limit"},
		{name: "describe path in params", args: []string{"describe", good, "--params", `{"path": "x"}`},
			wantErr: `"path" is the command's argument`},
		{name: "describe bad params", args: []string{"describe", good, "--params", `[1]`},
			wantErr: "--params: want a JSON object"},
		{name: "test good", args: []string{"test", good},
			want: []string{"plugin " + good, "ok      11 properties passed"}},
		{name: "test budget outside range", args: []string{"test", bad, "--args", "over"}, wantExit: true,
			want: []string{"Budget call 1 of 50: plugin badplugin: budget: budget 1.5 outside [0,1]", "FAILED  1 of 11 properties failed"},
			fail: []string{"Answers"}},
		{name: "test NaN budget", args: []string{"test", bad, "--args", `["nan"]`}, wantExit: true,
			want: []string{"budget NaN outside [0,1]"}, fail: []string{"Answers"}},
		{name: "test accepts unknown params", args: []string{"test", bad, "--args", "accept-all"}, wantExit: true,
			want: []string{"the plugin accepted gate_params.sluice_plugin_test_unknown"}, fail: []string{"RefusesUnknownParams"}},
		{name: "test missing binary", args: []string{"test", filepath.Join(t.TempDir(), "nope")}, wantExit: true,
			want: []string{"FAILED  the plugin did not start; the other properties need one and were not run"}, fail: []string{"Starts"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(t, append([]string{"plugin"}, tt.args...)...)
			var ee exitError
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q; out:\n%s", err, tt.wantErr, out)
				}
				return
			case tt.wantExit && (!errors.As(err, &ee) || ee.code != 1):
				t.Fatalf("err = %v, want exit status 1; out:\n%s", err, out)
			case !tt.wantExit && err != nil:
				t.Fatalf("err = %v; out:\n%s", err, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if tt.args[0] != "test" {
				return
			}
			got := statuses(out)
			if tt.name == "test missing binary" {
				if len(got) != 1 || got["Starts"] != "FAIL" {
					t.Errorf("properties %v, want only Starts, failed:\n%s", got, out)
				}
				return
			}
			for _, p := range allProps {
				want := "PASS"
				for _, f := range tt.fail {
					if f == p {
						want = "FAIL"
					}
				}
				if got[p] != want {
					t.Errorf("%s: %q, want %s:\n%s", p, got[p], want, out)
				}
			}
			if len(got) != len(allProps) {
				t.Errorf("%d property lines, want %d:\n%s", len(got), len(allProps), out)
			}
		})
	}
}

// A property that outlives --timeout fails, and the report goes on.
func TestPluginTestTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin binaries")
	}
	_, bad := buildPlugins(t)
	// Its cleanups run at the timeout and end it, as closing a gate ends
	// the calls waiting on it.
	res := runProp("Hangs", 50*time.Millisecond, func(t *propT) {
		unblock := make(chan struct{})
		t.Cleanup(func() { close(unblock) })
		<-unblock
	})
	if !res.failed() || !strings.Contains(strings.Join(res.errs, "\n"), "did not finish within 50ms") {
		t.Errorf("a hanging property: %+v", res)
	}
	// Admit hangs: Answers fails at its own 1s bound.
	out, err := run(t, "plugin", "test", bad, "--args", "admit-hangs", "--timeout", "1500ms")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("err = %v, want exit status 1; out:\n%s", err, out)
	}
	if got := statuses(out); got["Answers"] != "FAIL" || got["Starts"] != "PASS" || got["Concurrent"] != "FAIL" ||
		!strings.Contains(out, "Admit call 1 of 50") || !strings.Contains(out, "did not finish within 1.5s") {
		t.Errorf("report:\n%s", out)
	}
}

// The Python example answers describe like a Go plugin (its end-to-end tests
// live in examples/gate-plugin-python).
func TestPluginDescribePython(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python plugin")
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import grpc, google.protobuf, cryptography").CombinedOutput(); err != nil {
		t.Fatalf("/usr/bin/python3 cannot import grpc, google.protobuf and cryptography (%v: %s); install the Debian packages python3-grpcio python3-protobuf python3-cryptography", err, out)
	}
	script, err := filepath.Abs("../../examples/gate-plugin-python/gate_plugin.py")
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "plugin", "describe", script, "--params", `{"budget": 0.25, "start_timeout": "60s"}`)
	if err != nil {
		t.Fatalf("%v; out:\n%s", err, out)
	}
	for _, w := range []string{"protocol     1", "mutual TLS   true", "implements   Budget, Admit", "description  budget 0.25 set in gate_params (python)"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
