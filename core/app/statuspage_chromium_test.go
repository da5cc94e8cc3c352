package app

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testenv/headless"
)

// pageView is what a person sees of one queue on the page.
type pageView struct {
	Text        string   `json:"text"`        // the queue card's visible text
	Name        string   `json:"name"`        // the card's title
	Throughput  string   `json:"throughput"`  // the throughput figure
	Codes       []string `json:"codes"`       // the result codes shown
	Points      int      `json:"points"`      // points of the budget chart's line
	Total       string   `json:"total"`       // "results by code · N total"
	Live        string   `json:"live"`        // the refresh indicator
	Resources   []string `json:"resources"`   // every URL the page loaded
	Origin      string   `json:"origin"`      // the page's origin
	PoolRows    int      `json:"poolRows"`    // rows of the worker pools table
	GateRows    int      `json:"gateRows"`    // rows of the gates table
	HeaderState string   `json:"headerState"` // version, uptime, transport
}

const viewJS = `(() => {
  const card = document.querySelector('article.queue[data-queue="` + e2eQueue + `"]');
  const line = card && card.querySelector("svg.budget-chart polyline");
  const pts = line ? line.getAttribute("points").trim().split(/\s+/).filter(p => /^[\d.]+,[\d.]+$/.test(p)) : [];
  return {
    text: card ? card.innerText : "",
    name: card ? card.querySelector("h3").innerText : "",
    throughput: card ? card.querySelector('[data-field="throughput"]').innerText : "",
    codes: card ? [...card.querySelectorAll(".chip[data-code]")].map(c => c.innerText) : [],
    points: pts.length,
    total: card ? card.querySelector(".results .label").innerText : "",
    live: document.getElementById("live").innerText,
    resources: performance.getEntriesByType("resource").map(e => e.name),
    origin: location.origin,
    poolRows: document.querySelectorAll("#pools tr[data-pool]").length,
    gateRows: document.querySelectorAll("#gates tr[data-gate]").length,
    headerState: document.querySelector("header").innerText,
  };
})()`

// TestStatusPageInChromium loads the status page in headless Chromium while
// traffic runs and checks what a person would see: the queue by its name, a
// throughput above zero, the results by code, the budget chart (an SVG line
// with points), the page refreshing itself, and nothing loaded from anywhere
// but sluice. It saves a screenshot to the test's temp dir (and to
// $SLUICE_SCREENSHOT_DIR when set).
func TestStatusPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts headless Chromium; skipped with -short")
	}
	browser := testenv.LookPath(t, "chromium", "chromium")
	_, url := newGateway(t)
	h := startStatusApp(t, url, nil)
	traffic(t, h, 4*time.Millisecond, 15)
	h.waitResults(10, 10*time.Second)
	base := "http://" + h.app.Addr("metrics")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bctx, closeBrowser := headless.Browser(ctx, browser, t.Logf, chromedp.WindowSize(1280, 900))
	defer closeBrowser()

	if err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`article.queue[data-queue="`+e2eQueue+`"] svg.budget-chart`)),
	); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	// The first render: wait until it shows results and a throughput.
	if _, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](
		`(() => { const c = document.querySelector('article.queue[data-queue="`+e2eQueue+`"]');
		  return c && c.querySelector(".chip[data-code=ok]") && parseFloat(c.querySelector('[data-field="throughput"]').innerText) > 0; })()`,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(8*time.Second))); err != nil {
		t.Fatalf("the page shows no results or no throughput: %v", err)
	}
	first, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](viewJS))
	if err != nil {
		t.Fatal(err)
	}
	// The page refreshes itself (every 2 s): the total it shows grows.
	if _, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](
		`document.querySelector('article.queue[data-queue="`+e2eQueue+`"] .results .label').innerText !== `+strconv.Quote(first.Total),
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(6*time.Second))); err != nil {
		t.Fatalf("the page did not refresh (still %q): %v", first.Total, err)
	}
	v, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](viewJS))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("queue card as seen:\n%s", v.Text)

	if v.Name != e2eQueue || !strings.Contains(v.Text, e2eQueue) {
		t.Errorf("queue name %q not shown", v.Name)
	}
	tp, err := strconv.ParseFloat(strings.Fields(v.Throughput)[0], 64)
	if err != nil || tp <= 0 || !strings.Contains(v.Throughput, "req/s") {
		t.Errorf("throughput %q, want a positive req/s figure", v.Throughput)
	}
	if len(v.Codes) != 2 || !strings.HasPrefix(v.Codes[0], "ok") || !strings.HasPrefix(v.Codes[1], "http_error") {
		t.Errorf("results by code %q, want ok and http_error", v.Codes)
	}
	if v.Points < 2 {
		t.Errorf("budget chart line has %d points", v.Points)
	}
	for _, want := range []string{"WAITING", "IN FLIGHT", "DELAYED", "DEAD-LETTERED", "THROUGHPUT", "of 8 · max 8", "worker pool default", "memory", "constant"} {
		if !strings.Contains(v.Text, want) {
			t.Errorf("the queue card lacks %q", want)
		}
	}
	if v.PoolRows != 1 || v.GateRows != 1 {
		t.Errorf("%d worker pool rows, %d gate rows; want 1 and 1", v.PoolRows, v.GateRows)
	}
	if !strings.HasPrefix(v.Live, "● live") || !strings.Contains(v.HeaderState, "transport") {
		t.Errorf("header %q, indicator %q", v.HeaderState, v.Live)
	}
	for _, r := range v.Resources {
		if !strings.HasPrefix(r, v.Origin+"/") {
			t.Errorf("the page loaded %s, outside %s", r, v.Origin)
		}
	}

	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 400 || len(shot) < 20_000 {
		t.Errorf("screenshot %dx%d, %d bytes: too small", b.Dx(), b.Dy(), len(shot))
	}
	dirs := []string{t.TempDir()}
	if d := os.Getenv("SLUICE_SCREENSHOT_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		p := filepath.Join(d, "status-page.png")
		if err := os.WriteFile(p, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", p, len(shot))
	}
}
