package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testenv/headless"
)

// batchAPIExample is the Batch API example config (examples/batch-api).
var batchAPIExample = filepath.Join("..", "..", "examples", "batch-api", "sluice.json")

// TestBatchAPIExample: `sluice validate` accepts the example, and `sluice
// serve` runs it (with the test's gateway, free port and temporary
// directories, one call at a time) until a small batch uploaded over HTTP
// is completed and its output holds one answer per line. The status page,
// in headless Chromium, lists the batch with its progress while it runs and
// its final counts once it completed, refreshing itself.
func TestBatchAPIExample(t *testing.T) {
	out, err := run(t, "validate", "--config", batchAPIExample)
	if err != nil || !strings.HasPrefix(out, "ok: transport memory, 1 queue(s)") {
		t.Fatalf("validate: %q %v", out, err)
	}
	data, err := os.ReadFile(batchAPIExample)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	browser := testenv.LookPath(t, "chromium", "chromium")
	const n = 30 // lines
	// 200 ms a call, one at a time: the batch runs for about 6 s.
	gw := startSim(t, simulator.Config{Latency: simulator.Uniform(200*time.Millisecond, 200*time.Millisecond)})
	doc["concurrency"] = 1
	doc["transport_config"].(map[string]any)["queues"].([]any)[0].(map[string]any)["igw_base_url"] = gw
	dir := t.TempDir()
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	b := doc["batch_api"].(map[string]any)
	b["listen"] = api
	b["files"].(map[string]any)["dir"] = filepath.Join(dir, "files")
	b["state"].(map[string]any)["path"] = filepath.Join(dir, "state.db")
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := writeFile(t, "sluice.json", string(raw))

	metrics := testenv.FreePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctx, "", "serve", "--config", f, "--metrics-port", strconv.Itoa(metrics), "--listen-host", "127.0.0.1",
			"--health-port", "-1", "--drain-timeout", "5s")
		done <- err
	}()
	base := "http://" + api
	waitListening(t, api, done)
	// The browser starts before the batch is created: the page is open
	// while the batch runs.
	ids := make(chan string, 1)
	shown := watchBatchInChromium(t, browser, fmt.Sprintf("http://127.0.0.1:%d/", metrics), ids, n)

	var input bytes.Buffer
	for i := range n {
		fmt.Fprintf(&input, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi %d"}]}}`+"\n", i, i)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(input.Bytes())
	_ = mw.Close()
	var file struct{ ID string }
	postJSON(t, base+"/v1/files", mw.FormDataContentType(), &form, &file)
	var job struct {
		ID           string `json:"id"`
		Status       string `json:"status"`
		OutputFileID string `json:"output_file_id"`
	}
	postJSON(t, base+"/v1/batches", "application/json",
		strings.NewReader(fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, file.ID)), &job)
	ids <- job.ID
	deadline := time.Now().Add(30 * time.Second)
	for job.Status != "completed" {
		if time.Now().After(deadline) {
			t.Fatalf("batch status %s after 30s", job.Status)
		}
		time.Sleep(100 * time.Millisecond)
		getJSON(t, base+"/v1/batches/"+job.ID, &job)
	}
	resp, err := http.Get(base + "/v1/files/" + job.OutputFileID + "/content")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if len(lines) != n {
		t.Fatalf("output has %d lines, want %d:\n%s", len(lines), n, body)
	}
	for _, l := range lines {
		var o struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(l), &o); err != nil || o.Response.StatusCode != 200 || !strings.HasPrefix(o.CustomID, "c") {
			t.Errorf("output line %s (%v)", l, err)
		}
	}
	// The status page lists the batch with its progress.
	var page struct {
		Extra []struct{ Label, Value string } `json:"extra"`
	}
	getJSON(t, fmt.Sprintf("http://127.0.0.1:%d/status.json", metrics), &page)
	listed := false
	for _, fig := range page.Extra {
		if fig.Label == "batch "+job.ID && strings.HasPrefix(fig.Value, fmt.Sprintf("completed %d/%d", n, n)) {
			listed = true
		}
	}
	if !listed {
		t.Errorf("status page extra %+v: no line for %s with its progress", page.Extra, job.ID)
	}
	if s := <-shown; s.err != nil {
		t.Errorf("status page in Chromium: %v", s.err)
	} else {
		t.Logf("Chromium showed %q, then %q", s.during, s.after)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// chromiumView is what the status page showed of a batch.
type chromiumView struct {
	during, after string // the batch's row while in progress, and once completed
	err           error
}

// watchBatchInChromium loads the status page in headless Chromium and, in
// the background, waits until it lists the Batch API, then for the batch
// whose id comes on ids, until its row under "Also" shows it in progress
// with fewer than n lines answered, then (the page refreshing itself, no
// reload) completed with n of n.
func watchBatchInChromium(t *testing.T, browser, url string, ids <-chan string, n int) <-chan chromiumView {
	t.Helper()
	out := make(chan chromiumView, 1)
	go func() {
		var v chromiumView
		defer func() { out <- v }()
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		bctx, closeBrowser := headless.Browser(ctx, browser, nil)
		defer closeBrowser()
		if v.err = chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`#extra tr[data-extra="Batch API"]`))); v.err != nil {
			v.err = fmt.Errorf("the page lists no Batch API: %w", v.err)
			return
		}
		var id string
		select {
		case id = <-ids:
		case <-ctx.Done():
			v.err = ctx.Err()
			return
		}
		row := fmt.Sprintf(`#extra tr[data-extra="batch %s"]`, id)
		text := fmt.Sprintf(`(() => { const r = document.querySelector(%q); return r ? r.innerText : ""; })()`, row)
		if v.err = chromedp.Do(bctx, chromedp.WaitVisible(chromedp.CSS(row))); v.err != nil {
			v.err = fmt.Errorf("no row for batch %s: %w", id, v.err)
			return
		}
		inProgress := regexp.MustCompile(`in_progress (\d+)/` + strconv.Itoa(n) + ` \(0 failed\)`)
		for v.during == "" {
			s, err := chromedp.Run(bctx, chromedp.Evaluate[string](text))
			if err != nil {
				v.err = err
				return
			}
			if m := inProgress.FindStringSubmatch(s); m != nil {
				if k, _ := strconv.Atoi(m[1]); k < n {
					v.during = s
				}
			}
			if v.during == "" && strings.Contains(s, "completed") {
				v.err = fmt.Errorf("the batch's row showed %q before it showed the batch in progress", s)
				return
			}
			if v.during == "" && ctx.Err() != nil {
				v.err = fmt.Errorf("the batch's row never showed it in progress (last %q)", s)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		done := fmt.Sprintf("completed %d/%d (0 failed)", n, n)
		if _, v.err = chromedp.Run(bctx, chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s.includes(%q)`, text, done),
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); v.err != nil {
			v.err = fmt.Errorf("the batch's row never showed %q: %w", done, v.err)
			return
		}
		v.after, v.err = chromedp.Run(bctx, chromedp.Evaluate[string](text))
	}()
	return out
}

func waitListening(t *testing.T, addr string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended before listening: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 30s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func postJSON(t *testing.T, url, ctype string, body io.Reader, into any) {
	t.Helper()
	resp, err := http.Post(url, ctype, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %s %s", url, resp.Status, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("POST %s: %s: %v", url, b, err)
	}
}

func getJSON(t *testing.T, url string, into any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
