package demo

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testenv/headless"
)

// The purpose demo's status page shows the live line's figures: in
// status.json and, rendered, in headless Chromium under "Also", with
// interactive TTFT p99 against its floor as a chart; on a preset where the
// gate dispatches per pod, the queue's card charts the batch in flight on
// each pod.
func TestPoolDemoStatusPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts headless Chromium; skipped with -short")
	}
	browser := testenv.LookPath(t, "chromium", "chromium")
	type seen struct {
		json  []status.Figure
		gates []status.Gate
		shown string
		// lines: polylines of the TTFT chart and of the pod chart
		ttftLines, podLines int
		err                 error
	}
	got := make(chan seen, 1)
	_, err := RunPool(context.Background(), PoolOptions{
		Preset: poolsim.PresetVLLM8BH100Seats16, Batch: 60, BatchOutput: 64, Floor: time.Second,
		Waves: poolsim.Waves{Warmup: time.Second, Burst: 3 * time.Second, Idle: 2 * time.Second, Cycles: 1, BurstRate: 20, IdleRate: 4},
		OnStatus: func(url string) {
			go func() {
				var s seen
				defer func() { got <- s }()
				time.Sleep(2500 * time.Millisecond) // a few seconds of history
				resp, err := http.Get(url + "status.json")
				if err != nil {
					s.err = err
					return
				}
				var snap status.Snapshot
				s.err = json.NewDecoder(resp.Body).Decode(&snap)
				resp.Body.Close()
				s.json, s.gates = snap.Extra, snap.Gates
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				bctx, closeBrowser := headless.Browser(ctx, browser, nil)
				defer closeBrowser()
				if err := chromedp.Do(bctx, chromedp.Navigate(url),
					chromedp.WaitVisible(chromedp.CSS(`#extra tr[data-extra="batch done"]`)),
					chromedp.WaitVisible(chromedp.CSS(`#queues [data-field="pods"] svg`))); err != nil {
					if s.err == nil {
						s.err = err
					}
					return
				}
				text, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("#extra").innerText`))
				if err != nil && s.err == nil {
					s.err = err
				}
				s.shown = text
				s.ttftLines, err = chromedp.Run(bctx, chromedp.Evaluate[int](
					`document.querySelectorAll('#extra article[data-chart="interactive TTFT p99, last 2 s"] svg polyline').length`))
				if err != nil && s.err == nil {
					s.err = err
				}
				s.podLines, err = chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#queues [data-field="pods"] svg polyline').length`))
				if err != nil && s.err == nil {
					s.err = err
				}
			}()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s.err != nil {
		t.Fatal(s.err)
	}
	labels := map[string]bool{}
	for _, f := range s.json {
		labels[f.Label] = true
		if f.Label == "interactive TTFT p99, last 2 s" && (f.Chart == nil || len(f.Chart.Lines) != 2 || len(f.Chart.Lines[0].Points) == 0) {
			t.Errorf("status.json: the TTFT figure has no chart of its p99 and floor: %+v", f.Chart)
		}
	}
	if len(s.gates) != 1 || len(s.gates[0].Pods) != 2 || len(s.gates[0].Pods[0].History) == 0 {
		t.Errorf("status.json: the gate's pods %+v, want 2 with their history", s.gates)
	}
	if s.ttftLines != 2 || s.podLines != 2 {
		t.Errorf("the page draws %d lines of TTFT (want p99 and floor) and %d of pods (want 2)", s.ttftLines, s.podLines)
	}
	for _, want := range []string{"phase", "interactive TTFT p99, last 2 s", "batch done", "sluice in-flight limit", "batch per pod (in flight / limit)"} {
		if !labels[want] {
			t.Errorf("status.json extra lacks %q: %+v", want, s.json)
		}
		if !strings.Contains(s.shown, want) {
			t.Errorf("the page does not show %q; it shows:\n%s", want, s.shown)
		}
	}
}
