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
// status.json and, rendered, in headless Chromium under "Also".
func TestPoolDemoStatusPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts headless Chromium; skipped with -short")
	}
	browser := testenv.LookPath(t, "chromium", "chromium")
	type seen struct {
		json  []status.Figure
		shown string
		err   error
	}
	got := make(chan seen, 1)
	_, err := RunPool(context.Background(), PoolOptions{
		Batch: 30, BatchOutput: 64, Floor: time.Second,
		Waves: poolsim.Waves{Warmup: time.Second, Burst: 3 * time.Second, Idle: 2 * time.Second, Cycles: 1, BurstRate: 10, IdleRate: 1},
		OnStatus: func(url string) {
			go func() {
				var s seen
				defer func() { got <- s }()
				time.Sleep(1500 * time.Millisecond)
				resp, err := http.Get(url + "status.json")
				if err != nil {
					s.err = err
					return
				}
				var snap status.Snapshot
				s.err = json.NewDecoder(resp.Body).Decode(&snap)
				resp.Body.Close()
				s.json = snap.Extra
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				bctx, closeBrowser := headless.Browser(ctx, browser, nil)
				defer closeBrowser()
				if err := chromedp.Do(bctx, chromedp.Navigate(url),
					chromedp.WaitVisible(chromedp.CSS(`#extra tr[data-extra="batch done"]`))); err != nil {
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
	}
	for _, want := range []string{"phase", "interactive TTFT p99, last 2 s", "batch done", "sluice in-flight limit"} {
		if !labels[want] {
			t.Errorf("status.json extra lacks %q: %+v", want, s.json)
		}
		if !strings.Contains(s.shown, want) {
			t.Errorf("the page does not show %q; it shows:\n%s", want, s.shown)
		}
	}
}
