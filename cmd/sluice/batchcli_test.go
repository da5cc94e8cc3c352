package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

// startBatchServe runs `sluice serve` in-process with the Batch API on the
// memory transport, in front of a gateway simulator answering each call
// after latency, and returns the API's base URL.
func startBatchServe(t *testing.T, latency time.Duration) string {
	t.Helper()
	gw := startSim(t, simulator.Config{Latency: simulator.Fixed(latency)})
	dir := t.TempDir()
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	doc := map[string]any{
		"transport": "memory", "concurrency": 4,
		"transport_config": map[string]any{"result_queue_name": "results",
			"queues": []any{map[string]any{"id": "batch", "queue_name": "batch", "igw_base_url": gw}}},
		"batch_api": map[string]any{"enabled": true, "listen": api, "queue": "batch",
			"files": map[string]any{"dir": filepath.Join(dir, "files")},
			"state": map[string]any{"path": filepath.Join(dir, "state.db")}},
	}
	raw, _ := json.Marshal(doc)
	f := writeFile(t, "sluice.json", string(raw))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctx, "", "serve", "--config", f, "--metrics-port", strconv.Itoa(testenv.FreePort(t)),
			"--listen-host", "127.0.0.1", "--health-port", "-1", "--drain-timeout", "5s")
		done <- err
	}()
	waitListening(t, api, done)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + api
}

// batchInput writes n chat-completion lines to dir/name.
func batchInput(t *testing.T, dir, name string, n int) string {
	t.Helper()
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi %d"}]}}`+"\n", i, i)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// customIDs reads a batch output or error file: custom_id → how many lines hold it.
func customIDs(t *testing.T, path string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for l := range strings.Lines(string(data)) {
		var o struct {
			CustomID string `json:"custom_id"`
		}
		if err := json.Unmarshal([]byte(l), &o); err != nil || o.CustomID == "" {
			t.Fatalf("%s: line %q (%v)", path, l, err)
		}
		ids[o.CustomID]++
	}
	return ids
}

// TestBatchCLI drives `sluice batch submit --wait|status|list|download|
// cancel` against a real `sluice serve` with the Batch API.
func TestBatchCLI(t *testing.T) {
	api := startBatchServe(t, 100*time.Millisecond)
	ctx := context.Background()
	dir := t.TempDir()

	// submit --wait: the id first, progress on stderr, the output next to FILE.
	const n = 12
	in := batchInput(t, dir, "in.jsonl", n)
	out, errOut, err := runCLI(t, ctx, "", "batch", "--api", api, "submit", in, "--wait", "--interval", "50ms", "--metadata", "team=search", "--metadata", "run=7")
	if err != nil {
		t.Fatalf("submit --wait: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	id := lines[0]
	if !strings.HasPrefix(id, "batch_") {
		t.Fatalf("submit printed %q first, want the batch id", lines[0])
	}
	outFile := filepath.Join(dir, id+"_output.jsonl")
	if want := fmt.Sprintf("output file: %s (%d lines)", outFile, n); !strings.Contains(out, want) {
		t.Errorf("submit stdout %q lacks %q", out, want)
	}
	if want := fmt.Sprintf("%s completed: %d/%d answered", id, n, n); !strings.Contains(errOut, want) {
		t.Errorf("submit stderr %q lacks the progress line %q", errOut, want)
	}
	ids := customIDs(t, outFile)
	for i := range n {
		if ids[fmt.Sprint("c", i)] != 1 {
			t.Errorf("output holds c%d %d times, want once", i, ids[fmt.Sprint("c", i)])
		}
	}
	if len(ids) != n {
		t.Errorf("output holds %d custom ids, want %d", len(ids), n)
	}

	out, _, err = runCLI(t, ctx, "", "batch", "--api", api, "status", id)
	for _, want := range []string{"id           " + id, "status       completed", fmt.Sprintf("requests     %d total, %d completed, 0 failed", n, n), "metadata     team=search", "metadata     run=7"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("status: %v; output lacks %q:\n%s", err, want, out)
		}
	}
	out, _, err = runCLI(t, ctx, "", "batch", "--api", api, "status", id, "--json")
	var obj struct{ ID, Status string }
	if err != nil || json.Unmarshal([]byte(out), &obj) != nil || obj.ID != id || obj.Status != "completed" {
		t.Errorf("status --json: %v %q", err, out)
	}

	if _, _, err := runCLI(t, ctx, "", "batch", "--api", api, "status", "batch_nope"); err == nil || !strings.Contains(err.Error(), "get batch batch_nope: 404 ") {
		t.Errorf("status of an unknown batch: err %v, want the API's 404", err)
	}

	other := t.TempDir()
	out, _, err = runCLI(t, ctx, "", "batch", "--api", api, "download", id, "--out", other)
	if err != nil || !strings.Contains(out, filepath.Join(other, id+"_output.jsonl")) {
		t.Fatalf("download: %v %q", err, out)
	}
	a, _ := os.ReadFile(outFile)
	b, _ := os.ReadFile(filepath.Join(other, id+"_output.jsonl"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("download wrote %d bytes, submit --wait %d: not the same file", len(b), len(a))
	}

	// A file with an invalid line: the batch fails, the command says where.
	bad := filepath.Join(dir, "bad.jsonl")
	_ = os.WriteFile(bad, []byte(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`+"\nnot json\n"), 0o600)
	_, _, err = runCLI(t, ctx, "", "batch", "--api", api, "submit", bad, "--wait", "--interval", "50ms")
	if err == nil || !strings.Contains(err.Error(), "failed:\n  line 2: invalid_json_line") {
		t.Errorf("submit of an invalid file: err %v, want the batch failed with line 2 named", err)
	}

	// Cancel a batch while submit --wait follows it: the wait ends non-zero
	// and the partial output holds every custom_id once.
	const big = 200 // 200 × 100 ms at concurrency 4: 5 s uncancelled
	bigIn := batchInput(t, dir, "big.jsonl", big)
	type res struct {
		out, errOut string
		err         error
	}
	waited := make(chan res, 1)
	go func() {
		o, e, err := runCLI(t, ctx, "", "batch", "--api", api, "submit", bigIn, "--wait", "--interval", "50ms")
		waited <- res{o, e, err}
	}()
	var bigID string
	deadline := time.Now().Add(30 * time.Second)
	for bigID == "" {
		if time.Now().After(deadline) {
			t.Fatal("the big batch is not listed in_progress after 30s")
		}
		time.Sleep(50 * time.Millisecond)
		out, _, err := runCLI(t, ctx, "", "batch", "--api", api, "list", "--limit", "1")
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		if f := strings.Fields(strings.Split(out, "\n")[1]); len(f) > 1 && f[0] != id && f[1] == "in_progress" {
			bigID = f[0]
		}
	}
	out, _, err = runCLI(t, ctx, "", "batch", "--api", api, "cancel", bigID)
	if err != nil || !strings.HasPrefix(out, bigID+" cancelling:") {
		t.Fatalf("cancel: %v %q", err, out)
	}
	var r res
	select {
	case r = <-waited:
	case <-time.After(90 * time.Second):
		t.Fatal("submit --wait still waiting 90s after the cancel")
	}
	if r.err == nil || !strings.Contains(r.err.Error(), "batch "+bigID+" was cancelled") {
		t.Fatalf("submit --wait of the cancelled batch: err %v\n%s\n%s", r.err, r.out, r.errOut)
	}
	total := map[string]int{}
	for _, name := range []string{"_output.jsonl", "_error.jsonl"} {
		p := filepath.Join(dir, bigID+name)
		if _, err := os.Stat(p); err != nil {
			continue // no line of that kind
		}
		if !strings.Contains(r.out, p) {
			t.Errorf("submit stdout %q does not name %s", r.out, p)
		}
		for k, v := range customIDs(t, p) {
			total[k] += v
		}
	}
	for i := range big {
		if total[fmt.Sprint("c", i)] != 1 {
			t.Fatalf("cancelled batch: c%d in the output and error files %d times, want once", i, total[fmt.Sprint("c", i)])
		}
	}

	out, _, err = runCLI(t, ctx, "", "batch", "--api", api, "list")
	if err != nil || !strings.Contains(out, bigID+"  cancelled") || !strings.Contains(out, id+"  completed") {
		t.Errorf("list: %v\n%s", err, out)
	}
}

// TestBatchCLINoAPI: with nothing listening at --api, the commands say
// what to start.
func TestBatchCLINoAPI(t *testing.T) {
	api := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	for _, args := range [][]string{{"status", "batch_x"}, {"list"}, {"submit", batchInput(t, t.TempDir(), "in.jsonl", 1)}} {
		_, _, err := runCLI(t, context.Background(), "", append([]string{"batch", "--api", api}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "no Batch API at "+api+": is `sluice serve` running with batch_api enabled?") {
			t.Errorf("batch %v: err %v", args, err)
		}
	}
	_, _, err := runCLI(t, context.Background(), "", "batch", "--api", "127.0.0.1:8090", "list")
	if err == nil || !strings.Contains(err.Error(), "want an http(s) URL") {
		t.Errorf("--api without a scheme: err %v", err)
	}
	_, _, err = runCLI(t, context.Background(), "", "batch", "submit", "x.jsonl", "--metadata", "novalue")
	if err == nil || !strings.Contains(err.Error(), `--metadata "novalue": want key=value`) {
		t.Errorf("--metadata without =: err %v", err)
	}
}

// TestBatchDemo: `sluice batch demo` (the end of `make run`) needs no
// server and leaves one output line per request where it says.
func TestBatchDemo(t *testing.T) {
	dir := t.TempDir()
	out, errOut, err := runCLI(t, context.Background(), "", "batch", "demo", "--lines", "5", "--dir", dir, "--latency", "10ms")
	if err != nil {
		t.Fatalf("batch demo: %v\n%s\n%s", err, out, errOut)
	}
	i := strings.Index(out, "the output is in ")
	if i < 0 {
		t.Fatalf("batch demo printed no output path:\n%s", out)
	}
	path := strings.Fields(out[i+len("the output is in "):])[0]
	if filepath.Dir(path) != dir {
		t.Errorf("output %s is not in --dir %s", path, dir)
	}
	if ids := customIDs(t, path); len(ids) != 5 || ids["request-1"] != 1 || ids["request-5"] != 1 {
		t.Errorf("demo output custom ids %v, want request-1..5 once each", ids)
	}
}
