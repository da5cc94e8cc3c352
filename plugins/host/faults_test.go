package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/transports/memory"
)

// appRun is a running sluice (memory transport, one queue gated by a
// plugin) and the plugin gate it built.
type appRun struct {
	mem          *memory.Transport
	gate         *host.Gate
	queue, out   string
	gatewayCalls *atomic.Int64
}

// startApp runs sluice with one queue whose gate is the plugin of params,
// until the test ends.
func startApp(t *testing.T, params map[string]string) *appRun {
	t.Helper()
	calls := new(atomic.Int64)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(gw.Close)
	raw := map[string]json.RawMessage{}
	for k, v := range params {
		raw[k], _ = json.Marshal(v)
	}
	run := &appRun{mem: memory.New(memory.Options{}), queue: "requests", out: "results", gatewayCalls: calls}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 16, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: run.out, Queues: []config.Queue{{
			Queue: transport.Queue{Name: run.queue}, IGWBaseURL: gw.URL, GateType: host.Type, GateParams: raw,
		}}},
	}
	ad := app.NewAdapters()
	var built sync.Once
	err := ad.Gates.Register(host.Type, func(p gate.Params, env gate.Env) (gate.Gate, error) {
		g, err := host.Factory(p, env)
		built.Do(func() {
			switch g := g.(type) {
			case *host.AdmitGate:
				run.gate = g.Gate
			case *host.Gate:
				run.gate = g
			}
		})
		return g, err
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: run.mem, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	})
	return run
}

func (r *appRun) enqueue(t *testing.T, id string, deadline time.Time) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"id": id, "deadline": float64(deadline.UnixMilli()) / 1000, "payload": map[string]string{"p": "1"}})
	if err := r.mem.Enqueue(r.queue, b); err != nil {
		t.Fatal(err)
	}
}

// results waits until n results were written (or the wait ends) and
// returns them by id, failing on a second result for any id.
func (r *appRun) results(t *testing.T, n int, wait time.Duration) map[string]*wire.Result {
	t.Helper()
	timeout := time.After(wait)
	for {
		got, more := r.mem.ResultCount(r.out)
		if got >= n {
			break
		}
		select {
		case <-more:
		case <-timeout:
			t.Fatalf("%d results within %v, want %d", got, wait, n)
		}
	}
	out := map[string]*wire.Result{}
	for _, b := range r.mem.Results(r.out) {
		res, err := wire.DecodeResult(b)
		if err != nil {
			t.Fatal(err)
		}
		if out[res.ID] != nil {
			t.Errorf("a second result for %s: %+v after %+v", res.ID, res, out[res.ID])
		}
		out[res.ID] = res
	}
	return out
}

// The plugin, asked per request, is killed 10 times under load: every
// request is answered exactly once and successfully, and each time the
// gate has a new process within restart_backoff plus the refresh interval
// and start-up (bounded here by start_timeout).
func TestKilledUnderLoad(t *testing.T) {
	const backoff, refresh, startTimeout = 50 * time.Millisecond, 50 * time.Millisecond, 5 * time.Second
	r := startApp(t, map[string]string{
		"path": testBin, "admit": "true", "restart_backoff": backoff.String(), "refresh_interval": refresh.String(),
		"start_timeout": startTimeout.String(),
	})
	deadline := time.Now().Add(2 * time.Minute)
	var sent atomic.Int64
	stop := make(chan struct{})
	loadDone := make(chan struct{})
	go func() { // the load: 1,000 requests a second, bounded
		defer close(loadDone)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for n := 0; n < 20_000; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			r.enqueue(t, fmt.Sprintf("r%d", n), deadline)
			sent.Add(1)
		}
	}()
	waitStart := func() int {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			if r.gate != nil {
				if pid := r.gate.PID(); pid != 0 {
					return pid
				}
			}
		}
		t.Fatal("no plugin process within 10s")
		return 0
	}
	pid := waitStart()
	var worst time.Duration
	for i := range 10 {
		time.Sleep(150 * time.Millisecond) // under load between kills
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for r.gate.PID() == pid {
			time.Sleep(time.Millisecond)
		}
		next := waitStart()
		back := time.Since(killed)
		worst = max(worst, back)
		if back > backoff+refresh+startTimeout {
			t.Errorf("kill %d: a new process after %v, want within restart_backoff + refresh + start-up", i+1, back)
		}
		pid = next
	}
	close(stop)
	<-loadDone
	n := int(sent.Load())
	got := r.results(t, n, 60*time.Second)
	for i := range n {
		res := got[fmt.Sprintf("r%d", i)]
		if res == nil || !res.OK() {
			t.Errorf("r%d: %+v, want a success", i, res)
		}
	}
	if len(got) != n {
		t.Errorf("%d results for %d requests", len(got), n)
	}
	ev := r.gate.Events()
	if ev["plugin_losses"] != 10 || ev["plugin_starts"] != 11 {
		t.Errorf("events %v; want 10 losses and 11 starts", ev)
	}
	t.Logf("%d requests, 10 kills, slowest recovery %v, gateway calls %d", n, worst, r.gatewayCalls.Load())
}

// A plugin that hangs in Admit never holds a request past its deadline:
// the call is bounded by it, and the request ends DEADLINE_EXCEEDED.
func TestHangingAdmitKeepsDeadlines(t *testing.T) {
	r := startApp(t, map[string]string{"path": testBin, "args": "hang-admit", "admit": "true"})
	deadline := time.Now().Add(1500 * time.Millisecond)
	for i := range 5 {
		r.enqueue(t, fmt.Sprintf("h%d", i), deadline)
	}
	got := r.results(t, 5, 20*time.Second)
	late := time.Since(deadline)
	for id, res := range got {
		if res.ErrorCode != wire.CodeDeadlineExceeded {
			t.Errorf("%s: %+v, want %s", id, res, wire.CodeDeadlineExceeded)
		}
	}
	// The results were all written by the time we looked; allow for the
	// scheduling of a loaded machine, far below a second Admit timeout.
	if late > time.Second {
		t.Errorf("the last result came %v after the deadline", late)
	}
	if n := r.gatewayCalls.Load(); n != 0 {
		t.Errorf("%d gateway calls, want none", n)
	}
}
