// Package gatepluginpython_test loads the Python gate plugin through sluice's
// plugin host: the gate conformance suite, the Budget/Admit/Describe round
// trips, go-plugin's AutoMTLS handshake, and a whole pipeline gated by it.
//
// It needs Debian's /usr/bin/python3 with python3-grpcio, python3-protobuf
// and python3-cryptography, and fails (never skips, except under -short)
// when they are missing.
package gatepluginpython_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/plugins/sdk"
	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
	"github.com/sluice-io/sluice/transports/memory"
)

// python is the interpreter the plugin's shebang names.
const python = "/usr/bin/python3"

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// The pipeline test links the whole app: the Pub/Sub client's
		// OpenCensus import starts a worker in an init function.
		if err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	depsOnce sync.Once
	depsErr  error
)

// plugin returns the plugin's absolute path, failing the test when Debian's
// Python or its gRPC packages are missing.
func pluginPath(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Python plugin processes")
	}
	depsOnce.Do(func() {
		out, err := exec.Command(python, "-c", "import grpc, google.protobuf, cryptography").CombinedOutput()
		if err != nil {
			depsErr = fmt.Errorf("%s cannot import grpc, google.protobuf and cryptography (%v: %s); "+
				"install the Debian packages python3 python3-grpcio python3-protobuf python3-cryptography", python, err, strings.TrimSpace(string(out)))
		}
	})
	if depsErr != nil {
		t.Fatal(depsErr)
	}
	p, err := filepath.Abs("gate_plugin.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func budgetFile(t testing.TB, b string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "budget")
	if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// newGate builds a plugin gate for the Python plugin through the host's
// factory, as a queue's gate_params would, starts the plugin, and closes
// it at cleanup. Starting here keeps the interpreter's start-up (seconds on
// a busy machine) out of the suite's 5 s query bounds; a start that fails
// (a refused config) fails the test's first query in the same way.
func newGate(t testing.TB, vals map[string]string) gate.Gate {
	t.Helper()
	p := map[string]string{"path": pluginPath(t), "restart_backoff": "50ms", "start_timeout": "60s"}
	for k, v := range vals {
		p[k] = v
	}
	g, err := host.Factory(gate.NewParams(p), gate.Env{})
	if err != nil {
		t.Fatalf("Factory: %v", err)
	}
	t.Cleanup(func() { _ = g.(interface{ Close() error }).Close() })
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = g.(interface{ Start(context.Context) error }).Start(c)
	return g
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// The suite runs with admit on: it then checks Budget and Admit (the host's
// side of admit off is plugins/host's business, tested there).
func TestConformance(t *testing.T) {
	file := budgetFile(t, "1")
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return newGate(t, map[string]string{"file": file, "admit": "true"})
	}, gatetest.Features{
		Set: func(t testing.TB, b float64) {
			if err := os.WriteFile(file, []byte(fmt.Sprint(b)), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		Failing: func(t testing.TB) gate.Gate {
			return newGate(t, map[string]string{"file": filepath.Join(t.TempDir(), "missing"), "admit": "true"})
		},
	})
}

func TestBudgetAndDescribe(t *testing.T) {
	file := budgetFile(t, "0.75")
	tests := []struct {
		name     string
		vals     map[string]string
		want     float64
		wantDesc string
	}{
		{"constant", map[string]string{"budget": "0.25"}, 0.25, "budget 0.25 set in gate_params (python)"},
		{"default", nil, 1, "budget 1 set in gate_params (python)"},
		{"file", map[string]string{"file": file}, 0.75, "when the number in " + file + " is 0 (python)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(t, tt.vals)
			if b, err := g.Budget(ctx(t)); err != nil || b != tt.want {
				t.Fatalf("Budget = %v, %v; want %v", b, err, tt.want)
			}
			if d := g.(gate.Describer).Describe(); !strings.HasPrefix(d, tt.wantDesc) {
				t.Errorf("Describe = %q, want it to start with %q", d, tt.wantDesc)
			}
		})
	}
	// A bad file is a failed query with the plugin's message; the process
	// keeps running.
	if err := os.WriteFile(file, []byte("1.5"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := newGate(t, map[string]string{"file": file}).(*host.Gate)
	if _, err := g.Budget(ctx(t)); err == nil || !strings.Contains(err.Error(), "1.5 is outside [0,1]") {
		t.Errorf("Budget with 1.5 in the file: %v, want the plugin's range error", err)
	}
	pid := g.PID()
	if err := os.WriteFile(file, []byte("0.5"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := g.Budget(ctx(t)); err != nil || b != 0.5 || g.PID() != pid {
		t.Errorf("Budget after fixing the file = %v, %v (pid %d → %d); want 0.5 from the same process", b, err, pid, g.PID())
	}
}

func TestAdmitRoundTrip(t *testing.T) {
	g := newGate(t, map[string]string{
		"admit": "true", "deny_tenants": "a, x", "defer_tenants": "b", "defer_delay": "250ms",
	})
	adm := g.(gate.Admitter)
	tests := []struct {
		tenant string
		want   gate.Decision
	}{
		{"a", gate.Decision{Verdict: gate.Reject, Reason: "tenant a is denied"}},
		{"b", gate.Decision{Verdict: gate.Defer, Delay: 250 * time.Millisecond, Reason: "tenant b is deferred"}},
		{"c", gate.Admitted},
		{"", gate.Admitted},
	}
	for _, tt := range tests {
		req := &wire.Request{
			ID: "r-" + tt.tenant, Deadline: time.Now().Add(time.Minute), Payload: json.RawMessage(`{}`),
			Metadata: map[string]string{"tenant": tt.tenant},
		}
		d, err := adm.Admit(ctx(t), req)
		if err != nil || d.Verdict != tt.want.Verdict || d.Delay != tt.want.Delay || d.Reason != tt.want.Reason {
			t.Errorf("tenant %q: Admit = %+v, %v; want %+v", tt.tenant, d, err, tt.want)
		}
	}
}

// The plugin checks its parameters in Configure; the host keeps its verdict.
func TestRefusedParams(t *testing.T) {
	tests := []struct {
		name string
		vals map[string]string
		want string
	}{
		{"unknown", map[string]string{"bogus": "1", "other": "2"}, "unknown gate_params: bogus, other"},
		{"bad delay", map[string]string{"defer_delay": "soon"}, "gate_params.defer_delay: 'soon' is not a duration"},
		{"bad budget", map[string]string{"budget": "2"}, "gate_params.budget: 2 is outside [0,1]"},
		{"both", map[string]string{"budget": "1", "file": "f"}, "exclude each other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(t, tt.vals).(*host.Gate)
			if err := g.Start(ctx(t)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start = %v, want an error containing %q", err, tt.want)
			}
			if g.PID() != 0 {
				t.Error("a process runs after a refused config")
			}
		})
	}
}

// With AutoMTLS (the host sends PLUGIN_CLIENT_CERT), the plugin serves TLS
// with its own certificate, sent in the handshake, and refuses a client
// without the host's certificate; health answers SERVING; Shutdown (the
// host's Close) ends the process.
func TestAutoMTLS(t *testing.T) {
	for _, mtls := range []bool{true, false} {
		t.Run(fmt.Sprintf("mtls=%v", mtls), func(t *testing.T) {
			client := plugin.NewClient(&plugin.ClientConfig{
				HandshakeConfig:  sdk.Handshake,
				VersionedPlugins: sdk.ClientPlugins(),
				Cmd:              exec.Command(pluginPath(t)),
				AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
				AutoMTLS:         mtls,
				StartTimeout:     time.Minute,
				Logger:           hclog.New(&hclog.LoggerOptions{Name: "python-plugin", Level: hclog.Info, Output: os.Stderr}),
			})
			defer client.Kill()
			cp, err := client.Client()
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			if v := client.NegotiatedVersion(); v != 1 {
				t.Errorf("negotiated protocol %d, want 1", v)
			}
			if err := cp.Ping(); err != nil {
				t.Errorf("health check: %v", err)
			}
			raw, err := cp.Dispense(sdk.PluginName)
			if err != nil {
				t.Fatal(err)
			}
			remote := raw.(gatepb.GateClient)
			cr, err := remote.Configure(ctx(t), &gatepb.ConfigureRequest{Params: map[string]string{"budget": "0.5"}})
			if err != nil || cr.GetError() != "" || !cr.GetAdmitter() {
				t.Fatalf("Configure = %v, %v; want an admitter", cr, err)
			}
			if b, err := remote.Budget(ctx(t), &gatepb.BudgetRequest{}); err != nil || b.GetBudget() != 0.5 {
				t.Errorf("Budget = %v, %v; want 0.5", b, err)
			}

			// A client that skips TLS cannot talk to a TLS plugin.
			addr := client.ReattachConfig().Addr
			conn, err := grpc.NewClient("passthrough:///plugin",
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, addr.Network(), addr.String())
				}))
			if err != nil {
				t.Fatal(err)
			}
			c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = grpc_health_v1.NewHealthClient(conn).Check(c, &grpc_health_v1.HealthCheckRequest{Service: "plugin"})
			cancel()
			_ = conn.Close()
			if mtls && err == nil {
				t.Error("a plaintext client reached the plugin served with AutoMTLS")
			}
			if !mtls && err != nil {
				t.Errorf("plaintext health check without AutoMTLS: %v", err)
			}

			// Close asks the plugin to shut down (plugin.GRPCController); the
			// process exits on its own.
			if err := cp.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for !client.Exited() {
				if time.Now().After(deadline) {
					t.Fatal("the plugin did not exit after Shutdown")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// The Python plugin gates a whole sluice over the memory transport: nothing
// is dispatched while its budget file says 0, everything once it says 1,
// and a denied tenant ends with GATE_DROPPED without reaching the gateway.
func TestThroughPipeline(t *testing.T) {
	var hits atomic.Int64
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			// dispatch.protocol auto's h2c preface, which a net/http server
			// hands to its handler: not a request.
			return
		}
		hits.Add(1)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer gw.Close()

	file := budgetFile(t, "0")
	params := map[string]json.RawMessage{}
	for k, v := range map[string]string{"path": pluginPath(t), "file": file, "admit": "true", "deny_tenants": "blocked", "start_timeout": "60s"} {
		params[k], _ = json.Marshal(v)
	}
	const queue, results = "requests", "results"
	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: results, Queues: []config.Queue{{
			Queue: transport.Queue{Name: queue}, IGWBaseURL: gw.URL, GateType: "plugin", GateParams: params,
		}}},
	}
	ad := app.NewAdapters()
	if err := ad.Gates.Register(host.Type, host.Factory); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(runCtx) }()
	defer func() {
		stop()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	}()

	deadline := time.Now().Add(time.Minute)
	for _, r := range []struct{ id, tenant string }{{"a", "t1"}, {"b", "t2"}, {"x", "blocked"}} {
		b, _ := json.Marshal(map[string]any{
			"id": r.id, "deadline": float64(deadline.UnixMilli()) / 1000, "payload": map[string]string{"p": "1"},
			"metadata": map[string]string{"tenant": r.tenant},
		})
		if err := mem.Enqueue(queue, b); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if n, _ := mem.ResultCount(results); n != 0 || hits.Load() != 0 {
		t.Fatalf("budget 0: %d results, %d gateway calls; want none", n, hits.Load())
	}
	if err := os.WriteFile(file, []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait := time.After(time.Minute)
	for {
		n, more := mem.ResultCount(results)
		if n >= 3 {
			break
		}
		select {
		case <-more:
		case <-wait:
			t.Fatalf("%d results after opening the gate, want 3", n)
		}
	}
	got := map[string]*wire.Result{}
	for _, b := range mem.Results(results) {
		r, err := wire.DecodeResult(b)
		if err != nil {
			t.Fatal(err)
		}
		got[r.ID] = r
	}
	for _, id := range []string{"a", "b"} {
		if r := got[id]; r == nil || r.ErrorCode != "" || r.StatusCode != 200 {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if r := got["x"]; r == nil || r.ErrorCode != wire.CodeGateDropped || !strings.Contains(r.ErrorMessage, "tenant blocked is denied") {
		t.Errorf("denied tenant: %+v, want %s with the plugin's reason", r, wire.CodeGateDropped)
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("gateway called %d times, want 2", n)
	}
}
