package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/internal/poolsim"
)

// The purpose demo, shortened: every batch request is answered exactly
// once (evictions included), the floor and the burst figures are
// measured, the batch goes through pool-headroom, and the live lines come
// once a second.
func TestPoolDemoAccountsForEveryRequest(t *testing.T) {
	var progress bytes.Buffer
	sum, err := RunPool(context.Background(), PoolOptions{
		Batch: 24, BatchOutput: 32, Floor: 2 * time.Second, Progress: &progress,
		Waves: poolsim.Waves{Warmup: time.Second, Burst: 2 * time.Second, Idle: 2 * time.Second, Cycles: 1, BurstRate: 10, IdleRate: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Missing != 0 || sum.Duplicates != 0 || sum.BatchOK != sum.Batch || sum.BatchFailed != 0 {
		t.Fatalf("batch not answered exactly once, ok: %+v", sum)
	}
	if sum.FloorP99Ms <= 0 || sum.BurstP99Ms <= 0 || sum.P99Ratio <= 0 || sum.InteractiveErrors != 0 {
		t.Fatalf("interactive figures missing or failed requests: %+v", sum)
	}
	if sum.BatchTokens != 24*32 {
		t.Errorf("batch tokens %d, want %d", sum.BatchTokens, 24*32)
	}
	if sum.ResumedTokens > 0 && sum.PrefixHitTokens == 0 {
		t.Errorf("%d tokens resumed but the pods' prefix caches served none: the continuations missed their blocks", sum.ResumedTokens)
	}
	if sum.Gate != "pool-headroom" {
		t.Errorf("gate %q", sum.Gate)
	}
	if n := strings.Count(progress.String(), "interactive TTFT p99"); n < 3 {
		t.Errorf("%d live lines, want at least one a second:\n%s", n, progress.String())
	}
}

// On a vLLM preset the demo runs the gate per pod (dispatch "pods", with
// kv_limit), and the live lines and the summary say what the batch held
// on each pod against the gate's limit there; its status.json carries the
// gate's pods with their history and the TTFT figure's chart.
func TestPoolDemoPerPod(t *testing.T) {
	var progress bytes.Buffer
	snap := make(chan status.Snapshot, 1)
	sum, err := RunPool(context.Background(), PoolOptions{
		Preset: poolsim.PresetVLLM8BH100Seats16, Batch: 40, BatchOutput: 32, Floor: 2 * time.Second, Progress: &progress,
		Waves: poolsim.Waves{Warmup: time.Second, Burst: 2 * time.Second, Idle: 2 * time.Second, Cycles: 1, BurstRate: 20, IdleRate: 4},
		OnStatus: func(url string) {
			go func() {
				var s status.Snapshot
				defer func() { snap <- s }()
				time.Sleep(2500 * time.Millisecond) // a few samples of history
				resp, err := http.Get(url + "status.json")
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
					t.Error(err)
				}
			}()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := <-snap
	if len(s.Gates) != 1 || len(s.Gates[0].Pods) != 2 {
		t.Fatalf("status.json gates %+v, want the gate with its 2 pods", s.Gates)
	}
	for _, p := range s.Gates[0].Pods {
		if !strings.Contains(p.Pod, "/pods/") || len(p.History) < 2 || p.History[len(p.History)-1][0] != float64(s.Now) {
			t.Errorf("status.json pod %+v: want its history (a sample or more, the reading now last)", p)
		}
	}
	var chart *status.Chart
	for _, f := range s.Extra {
		if f.Label == "interactive TTFT p99, last 2 s" {
			chart = f.Chart
		}
	}
	if chart == nil || chart.Unit != "ms" || len(chart.Lines) != 2 || len(chart.Lines[0].Points) == 0 || chart.Lines[1].Points[0][1] != sum.FloorP99Ms {
		t.Errorf("status.json TTFT chart %+v, want p99 points beside the floor's %v ms", chart, sum.FloorP99Ms)
	}
	if sum.Missing != 0 || sum.Duplicates != 0 || sum.BatchOK != sum.Batch {
		t.Fatalf("batch not answered exactly once, ok: %+v", sum)
	}
	if sum.Preset != poolsim.PresetVLLM8BH100Seats16 || sum.Pods != 2 || sum.SeatsPerPod != 16 {
		t.Errorf("pool %s %d×%d", sum.Preset, sum.Pods, sum.SeatsPerPod)
	}
	if string(sum.GateParams["dispatch"]) != `"pods"` || string(sum.GateParams["kv_limit"]) != "0.7" {
		t.Errorf("gate params %s", sum.GateParams)
	}
	if len(sum.PerPod) != 2 {
		t.Fatalf("per pod %+v, want 2 pods", sum.PerPod)
	}
	for _, p := range sum.PerPod {
		if !strings.Contains(p.Pod, "/pods/") || p.MaxInFlight <= 0 || p.MaxInFlight > 16 || p.BurstLimit <= 0 || p.BurstLimit > 16 {
			t.Errorf("pod %+v: want some batch in flight, within 16 seats", p)
		}
	}
	if !strings.Contains(progress.String(), "| per pod ") {
		t.Errorf("the live lines do not say what the batch holds per pod:\n%s", progress.String())
	}
}

// An unknown preset is refused before anything starts, naming the presets.
func TestPoolDemoUnknownPreset(t *testing.T) {
	_, err := RunPool(context.Background(), PoolOptions{Preset: "h200"})
	if err == nil || !strings.Contains(err.Error(), poolsim.PresetVLLM8BH100) {
		t.Fatalf("err %v, want one naming the presets", err)
	}
}
