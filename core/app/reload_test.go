package app

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

// syncBuffer is a log sink safe for the app's goroutines.
type syncBuffer struct{ testenv.Buffer }

func (s *syncBuffer) count(sub string) int { return strings.Count(s.String(), sub) }

// reloadRig is a running app whose queues come from a file it watches.
type reloadRig struct {
	*harness
	t    *testing.T
	file string
	gw   string
	logs *syncBuffer
}

// queueDoc is one queue of the file: id, its queue and result names, its
// max_concurrency.
type queueDoc struct {
	id   string
	max  int
	gate string // gate_params "budget" of the constant gate ("" : none)
}

func (r *reloadRig) write(qs ...queueDoc) {
	r.t.Helper()
	var entries []map[string]any
	for _, q := range qs {
		e := map[string]any{"id": q.id, "queue_name": "req:" + q.id, "result_queue_name": "res:" + q.id,
			"igw_base_url": r.gw, "max_concurrency": q.max}
		if q.gate != "" {
			e["gate_params"] = map[string]any{"budget": q.gate}
		}
		entries = append(entries, e)
	}
	b, err := json.Marshal(map[string]any{"queues": entries})
	if err != nil {
		r.t.Fatal(err)
	}
	r.writeRaw(string(b))
}

func (r *reloadRig) writeRaw(s string) {
	r.t.Helper()
	// Written beside and renamed, as a ConfigMap update swaps the file.
	tmp := r.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Rename(tmp, r.file); err != nil {
		r.t.Fatal(err)
	}
}

func (r *reloadRig) reloads(result string) float64 {
	return testutil.ToFloat64(r.app.metrics.QueueConfigReloads.WithLabelValues(result))
}

// waitReloads waits until the counter of result reaches n.
func (r *reloadRig) waitReloads(result string, n float64) {
	r.t.Helper()
	waitReload(r.t, 10*time.Second, fmt.Sprintf("reloads{result=%q} = %v", result, n), func() bool { return r.reloads(result) >= n })
	if got := r.reloads(result); got != n {
		r.t.Fatalf("reloads{result=%q} = %v, want %v", result, got, n)
	}
}

func waitReload(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// results waits for n results on queue id's result list and returns how
// many times each request id was answered.
func (r *reloadRig) results(id string, n int) map[string]int {
	r.t.Helper()
	var got [][]byte
	waitReload(r.t, 15*time.Second, fmt.Sprintf("%d results of %s", n, id), func() bool {
		got = r.mem.Results("res:" + id)
		return len(got) >= n
	})
	out := map[string]int{}
	for _, b := range got {
		var res wire.Result
		if err := json.Unmarshal(b, &res); err != nil {
			r.t.Fatalf("result %s: %v", b, err)
		}
		if !res.OK() {
			r.t.Errorf("request %s: error result %+v", res.ID, res)
		}
		out[res.ID]++
	}
	return out
}

func (r *reloadRig) enqueue(queue string, id string, script map[string]any) {
	r.t.Helper()
	if err := r.mem.Enqueue("req:"+queue, request(id, time.Now().Add(time.Minute), script)); err != nil {
		r.t.Fatal(err)
	}
}

// loadQueues reads the rig's file as serve reads --transport-config-file
// (the policy: the merge policy type, "" for the default).
func loadQueues(file string, policy ...string) (*config.Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	tc, err := config.ParseQueues(data, file)
	if err != nil {
		return nil, err
	}
	cfg := &config.Config{Transport: memory.Name, Concurrency: 32, MetricsPort: -1, HealthPort: -1, TransportConfig: tc}
	if len(policy) > 0 {
		cfg.MergePolicy.Type = policy[0]
	}
	cfg.SetDefaults()
	return cfg, nil
}

func startReloadRig(t *testing.T, first ...queueDoc) *reloadRig {
	t.Helper()
	return startReloadRigPolicy(t, "", first...)
}

func startReloadRigPolicy(t *testing.T, policy string, first ...queueDoc) *reloadRig {
	t.Helper()
	_, gw := newGateway(t)
	r := &reloadRig{t: t, file: filepath.Join(t.TempDir(), "queues.json"), gw: gw, logs: &syncBuffer{}}
	r.write(first...)
	load := func() (*config.Config, error) { return loadQueues(r.file, policy) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	r.harness = startAppWith(t, cfg, Options{Transport: memory.New(memory.Options{}), Logger: log, Registry: prometheus.NewRegistry(),
		Reload: &Reload{Interval: 10 * time.Millisecond, Files: []string{r.file}, Load: load}})
	waitReload(t, 10*time.Second, "the pipeline to run", r.app.Pipeline().Ready)
	return r
}

// TestReloadQueues rewrites the queue file of a running app: a queue added
// is served, a queue removed with requests in flight answers each of them
// exactly once and claims nothing more, a changed queue takes its new
// limit, broken files keep the running queues and are counted (each error
// logged once), and an empty list is allowed.
func TestReloadQueues(t *testing.T) {
	r := startReloadRig(t, queueDoc{id: "a", max: 16})
	r.enqueue("a", "a-0", nil)
	if got := r.results("a", 1); got["a-0"] != 1 {
		t.Fatalf("before any reload: results %v", got)
	}

	// Add b: its requests are answered.
	r.write(queueDoc{id: "a", max: 16}, queueDoc{id: "b", max: 4})
	r.waitReloads(metrics.ReloadSuccess, 1)
	for i := range 3 {
		r.enqueue("b", fmt.Sprintf("b-%d", i), nil)
	}
	if got := r.results("b", 3); len(got) != 3 {
		t.Fatalf("added queue b: results %v, want b-0..b-2 once each", got)
	}

	// Remove a while ten of its requests are at the gateway.
	const n = 10
	for i := range n {
		r.enqueue("a", fmt.Sprintf("slow-%d", i), map[string]any{"sleep_ms": 800})
	}
	waitReload(t, 10*time.Second, "a's requests in flight", func() bool {
		in, _, _ := r.app.Pipeline().Credits("a").Snapshot()
		return in == n
	})
	r.write(queueDoc{id: "b", max: 4})
	r.waitReloads(metrics.ReloadSuccess, 2)
	if r.app.Pipeline().Credits("a") != nil {
		t.Fatal("queue a still runs after its removal")
	}
	// Enqueued after the removal: nothing claims them any more.
	for i := range 3 {
		r.enqueue("a", fmt.Sprintf("late-%d", i), nil)
	}
	got := r.results("a", 1+n)
	for i := range n {
		if c := got[fmt.Sprintf("slow-%d", i)]; c != 1 {
			t.Errorf("slow-%d answered %d times, want exactly once", i, c)
		}
	}
	if len(got) != 1+n {
		t.Errorf("results of the removed queue: %v, want a-0 and slow-0..%d only", got, n-1)
	}
	d, err := r.mem.Depth(t.Context(), transportQueue("a"))
	if err != nil || d.Waiting != 3 || d.InFlight != 0 {
		t.Errorf("removed queue a: depth %+v (%v), want the 3 late requests waiting, none claimed", d, err)
	}
	waitReload(t, 10*time.Second, "the removed queue's sampled series to go", func() bool {
		return !hasSeries(t, r.app.Registry(), "llm_d_async_async_dispatch_budget", "a")
	})

	// Broken files: the running queues stay, each attempt is counted, an
	// error that stays the same is logged once.
	r.writeRaw(`{"queues": [`)
	r.waitReloads(metrics.ReloadError, 1)
	dup := `{"queues": [{"id": "b", "queue_name": "req:b", "result_queue_name": "res:b", "igw_base_url": "` + r.gw + `"},
		{"id": "b", "queue_name": "req:c", "result_queue_name": "res:c", "igw_base_url": "` + r.gw + `"}]}`
	r.writeRaw(dup)
	r.waitReloads(metrics.ReloadError, 2)
	r.writeRaw(dup + "\n") // other bytes, the same error
	r.waitReloads(metrics.ReloadError, 3)
	if c := r.logs.count("duplicate queue id"); c != 1 {
		t.Errorf("the duplicate-id error was logged %d times, want once", c)
	}
	// A transport option cannot change live: refused, named, counted.
	r.writeRaw(`{"batch_size": 7, "queues": [{"id": "b", "queue_name": "req:b", "result_queue_name": "res:b", "igw_base_url": "` + r.gw + `", "max_concurrency": 4}]}`)
	r.waitReloads(metrics.ReloadError, 4)
	if c := r.logs.count("transport_config.batch_size changed: restart sluice"); c != 1 {
		t.Errorf("the refused option change was logged %d times, want once naming transport_config.batch_size:\n%s", c, r.logs)
	}
	r.enqueue("b", "b-after-errors", nil)
	if got := r.results("b", 4); got["b-after-errors"] != 1 {
		t.Fatalf("queue b after the broken files: results %v", got)
	}
	if s := r.reloads(metrics.ReloadSuccess); s != 2 {
		t.Errorf("successes %v after the failures, want still 2", s)
	}

	// Change b's max_concurrency: it takes effect, b keeps answering.
	r.write(queueDoc{id: "b", max: 2})
	r.waitReloads(metrics.ReloadSuccess, 3)
	if m := r.app.Pipeline().Credits("b").Max(); m != 2 {
		t.Errorf("b's credits after the change: max %d, want 2", m)
	}
	r.enqueue("b", "b-changed", nil)
	if got := r.results("b", 5); got["b-changed"] != 1 {
		t.Fatalf("queue b after its change: results %v", got)
	}

	// No queues at all, then b again.
	r.writeRaw(`{"queues": []}`)
	r.waitReloads(metrics.ReloadSuccess, 4)
	r.write(queueDoc{id: "b", max: 2})
	r.waitReloads(metrics.ReloadSuccess, 5)
	r.enqueue("b", "b-back", nil)
	if got := r.results("b", 6); got["b-back"] != 1 {
		t.Fatalf("queue b re-added after an empty list: results %v", got)
	}
	if err := r.shutdown(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestReloadGateChange changes a queue's gate parameters: a closed gate
// (budget 0) stops the queue's claims, reopening it serves what waited.
func TestReloadGateChange(t *testing.T) {
	r := startReloadRig(t, queueDoc{id: "g", max: 4, gate: "0"})
	r.enqueue("g", "g-0", nil)
	r.write(queueDoc{id: "g", max: 4, gate: "1"})
	r.waitReloads(metrics.ReloadSuccess, 1)
	if got := r.results("g", 1); got["g-0"] != 1 {
		t.Fatalf("after opening the gate: results %v", got)
	}
	if err := r.shutdown(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestReloadOptionsChecked refuses a Reload that cannot work.
func TestReloadOptionsChecked(t *testing.T) {
	cfg, _ := loadQueuesFromDoc(t)
	for _, rl := range []*Reload{{Interval: 0, Files: []string{"x"}, Load: loadNothing}, {Interval: time.Second, Load: loadNothing}, {Interval: time.Second, Files: []string{"x"}}} {
		if _, err := New(cfg, Options{Adapters: testAdapters(t), Transport: memory.New(memory.Options{}), Reload: rl}); err == nil {
			t.Errorf("New accepted Reload %+v", rl)
		}
	}
}

func loadNothing() (*config.Config, error) { return nil, fmt.Errorf("none") }

func loadQueuesFromDoc(t *testing.T) (*config.Config, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "q.json")
	if err := os.WriteFile(file, []byte(`[{"queue_name": "q", "result_queue_name": "r", "igw_base_url": "http://127.0.0.1:1"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadQueues(file)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, file
}

// hasSeries reports whether metric name has a series with queue_id id.
func hasSeries(t *testing.T, reg *prometheus.Registry, name, id string) bool {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue_id" && l.GetValue() == id {
					return true
				}
			}
		}
	}
	return false
}

// transportQueue is the memory transport's queue of the rig's queue id.
func transportQueue(id string) transport.Queue { return transport.Queue{ID: id, Name: "req:" + id} }

// TestReloadShutdownWhileDraining shuts down while a removed queue's
// requests are still at the gateway: the drain lets them finish, each is
// answered once, and Run returns without error.
func TestReloadShutdownWhileDraining(t *testing.T) {
	r := startReloadRig(t, queueDoc{id: "a", max: 8}, queueDoc{id: "b", max: 8})
	const n = 5
	for i := range n {
		r.enqueue("a", fmt.Sprintf("slow-%d", i), map[string]any{"sleep_ms": 800})
	}
	waitReload(t, 10*time.Second, "a's requests in flight", func() bool {
		in, _, _ := r.app.Pipeline().Credits("a").Snapshot()
		return in == n
	})
	r.write(queueDoc{id: "b", max: 8})
	r.waitReloads(metrics.ReloadSuccess, 1)
	if err := r.shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	got := r.results("a", n)
	for i := range n {
		if c := got[fmt.Sprintf("slow-%d", i)]; c != 1 {
			t.Errorf("slow-%d answered %d times, want once", i, c)
		}
	}
}

// TestReloadTierPriority changes a queue under the tier-priority policy
// while its requests hold workers of the lanes: they finish, and the new
// settings serve the next ones (the lanes keep counting the workers the old
// requests held).
func TestReloadTierPriority(t *testing.T) {
	r := startReloadRigPolicy(t, config.PolicyTierPriority, queueDoc{id: "t", max: 4})
	for i := range 4 {
		r.enqueue("t", fmt.Sprintf("slow-%d", i), map[string]any{"sleep_ms": 600})
	}
	waitReload(t, 10*time.Second, "t's requests in flight", func() bool {
		in, _, _ := r.app.Pipeline().Credits("t").Snapshot()
		return in == 4
	})
	r.write(queueDoc{id: "t", max: 2})
	r.waitReloads(metrics.ReloadSuccess, 1)
	for i := range 4 {
		r.enqueue("t", fmt.Sprintf("next-%d", i), nil)
	}
	got := r.results("t", 8)
	for id, c := range got {
		if c != 1 {
			t.Errorf("%s answered %d times, want once", id, c)
		}
	}
	if len(got) != 8 {
		t.Errorf("results %v, want slow-0..3 and next-0..3", got)
	}
	if err := r.shutdown(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestReloadEvictSuspendedSeries: sluice_evict_suspended{queue} exists (at
// 0) while the queue evicts, and a reload that turns evict off removes it
// rather than leave its last value behind.
func TestReloadEvictSuspendedSeries(t *testing.T) {
	r := startReloadRig(t, queueDoc{id: "e", max: 2})
	if n := testutil.CollectAndCount(r.app.metrics.EvictSuspended); n != 0 {
		t.Fatalf("evict off: %d series of sluice_evict_suspended, want none", n)
	}
	doc := func(evict bool) string {
		return fmt.Sprintf(`{"queues":[{"id":"e","queue_name":"req:e","result_queue_name":"res:e","igw_base_url":%q,"max_concurrency":2,"evict":%t}]}`, r.gw, evict)
	}
	series := func() int { return testutil.CollectAndCount(r.app.metrics.EvictSuspended) }
	r.writeRaw(doc(true))
	r.waitReloads(metrics.ReloadSuccess, 1)
	if n, v := series(), testutil.ToFloat64(r.app.metrics.EvictSuspended.WithLabelValues("e")); n != 1 || v != 0 {
		t.Fatalf("evict on: %d series, value %v; want one at 0", n, v)
	}
	r.writeRaw(doc(false))
	r.waitReloads(metrics.ReloadSuccess, 2)
	waitReload(t, 5*time.Second, "the series to go", func() bool { return series() == 0 })
	if err := r.shutdown(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
