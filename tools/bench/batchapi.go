package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/boltstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	"github.com/sluice-io/sluice/transports/memory"
)

// batchAPITargets: the Batch API must cost little over using the queues
// directly (issue 24: ratio >= 0.8), and every line must come back 200.
func batchAPITargets() []target {
	return []target{
		noFailures("failed"),
		noFailures("baseline_failed"),
		minimum("ratio", 0.8, "a 50,000-line batch end to end over the same requests enqueued and read back through the submit seam (core/submit) directly"),
		reportedOnly("lines_per_s", "the Batch API's rate, upload to downloaded output"),
		reportedOnly("direct_lines_per_s", "the baseline's rate"),
		reportedOnly("rss_mb", "peak resident set of the bench process (both sides)"),
		reportedOnly("cpu_us_per_line", "the bench process's CPU time (user+system, dispatcher and simulator included) per line on the Batch API side"),
		reportedOnly("direct_cpu_us_per_line", "the same on the baseline side"),
		reportedOnly("allocs_per_line", "heap allocations per line on the Batch API side (the whole process)"),
		reportedOnly("direct_allocs_per_line", "the same on the baseline side"),
	}
}

const (
	batchAPILines    = 50_000
	batchAPIQueue    = "batch"
	batchAPIEndpoint = "/v1/chat/completions"
)

// runBatchAPI measures the OpenAI Batch API (front/batch) end to end: a
// 50,000-line file uploaded to /v1/files, a batch created on it, its status
// polled until completed, its output file downloaded and checked (one 200
// line per custom_id). The baseline is the same 50,000 requests (the same
// fields the front gives them, built from the same file) enqueued through
// the same producer seam (core/submit, the memory transport's producer, in chunks
// of the front's size) and their results read back from a route of their
// own and acked. Both sides run on a fresh deployment per run as serve
// builds it (memory transport, bolt state and disk files on a temp dir,
// the front at its defaults), 64 in flight to the 0-ms simulator; the two
// alternate (ratio.go).
func runBatchAPI(ctx context.Context, o options) (figures, error) {
	url, stop, err := zeroLatencyGateway()
	if err != nil {
		return nil, err
	}
	defer stop()
	input := batchAPIInput(batchAPILines)
	var api, direct, apiCPU, directCPU, apiAllocs, directAllocs []float64
	failed, baseFailed := 0, 0
	var stages, directStages []map[string]float64
	err = alternate(ctx, o.runs,
		func(ctx context.Context, _ int) error {
			c := startCost()
			var secs float64
			var out []byte
			var err error
			clock := newStageClock()
			// The label splits a -cpuprofile by side (pprof -tagfocus side=api).
			pprof.Do(ctx, pprof.Labels("side", "api"), func(ctx context.Context) {
				secs, out, err = batchAPIRun(ctx, url, input, clock)
			})
			if err != nil {
				return fmt.Errorf("batch api: %w", err)
			}
			cpu, allocs := c.perLine(batchAPILines) // the check below is the bench's, not the side's
			bad, err := batchOutputFailures(out, batchAPILines)
			if err != nil {
				return fmt.Errorf("batch api: %w", err)
			}
			api, failed = append(api, batchAPILines/secs), failed+bad
			stages = append(stages, clock.ms())
			apiCPU, apiAllocs = append(apiCPU, cpu), append(apiAllocs, allocs)
			return nil
		},
		func(ctx context.Context, _ int) error {
			c := startCost()
			var secs float64
			var bad int
			var err error
			clock := newStageClock()
			pprof.Do(ctx, pprof.Labels("side", "direct"), func(ctx context.Context) {
				secs, bad, err = batchDirectRun(ctx, url, input, clock)
			})
			if err != nil {
				return fmt.Errorf("direct: %w", err)
			}
			cpu, allocs := c.perLine(batchAPILines)
			direct, baseFailed = append(direct, batchAPILines/secs), baseFailed+bad
			directStages = append(directStages, clock.ms())
			directCPU, directAllocs = append(directCPU, cpu), append(directAllocs, allocs)
			return nil
		})
	if err != nil {
		return nil, err
	}
	f := figures{
		"lines":                  batchAPILines,
		"failed":                 float64(failed),
		"baseline_failed":        float64(baseFailed),
		"lines_per_s":            median(api),
		"direct_lines_per_s":     median(direct),
		"ratio":                  medianRatio(api, direct),
		"rss_mb":                 rssMB(),
		"cpu_us_per_line":        median(apiCPU),
		"direct_cpu_us_per_line": median(directCPU),
		"allocs_per_line":        median(apiAllocs),
		"direct_allocs_per_line": median(directAllocs),
	}
	for i := range api {
		fmt.Fprintf(os.Stderr, "bench: batch-api run %d/%d: api %.0f lines/s, direct %.0f lines/s, ratio %.2f; api stages (ms from the start):",
			i+1, len(api), api[i], direct[i], api[i]/direct[i])
		for _, name := range batchStageNames {
			fmt.Fprintf(os.Stderr, " %s %.0f", name, stages[i][name])
		}
		fmt.Fprintf(os.Stderr, "; direct done %.0f\n", directStages[i]["done"])
	}
	for _, name := range batchStageNames {
		f["at_"+name+"_ms"] = medianOf(stages, name)
	}
	for _, name := range batchDirectStageNames {
		f["direct_at_"+name+"_ms"] = medianOf(directStages, name)
	}
	return f, nil
}

// medianOf is the median of stage name over the runs (NaN when a run did
// not note it).
func medianOf(runs []map[string]float64, name string) float64 {
	vs := make([]float64, 0, len(runs))
	for _, r := range runs {
		v, ok := r[name]
		if !ok {
			return math.NaN()
		}
		vs = append(vs, v)
	}
	return median(vs)
}

// cost is where a side started in the process's CPU time and heap
// allocations: figures that do not change with the machine's load the way
// wall-clock rates do (the whole process counts: dispatcher, simulator and
// the side's own work; a side's deployment is stopped before it returns).
type cost struct {
	cpu    float64
	allocs uint64
}

func startCost() cost {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return cost{cpu: cpuSeconds(), allocs: ms.Mallocs}
}

// perLine is the CPU microseconds and allocations per line since c.
func (c cost) perLine(lines int) (cpuUS, allocs float64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return (cpuSeconds() - c.cpu) * 1e6 / float64(lines), float64(ms.Mallocs-c.allocs) / float64(lines)
}

// batchAPIInput is n chat-completion lines of one model.
func batchAPIInput(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":%q,"body":{"model":"m1","messages":[{"role":"user","content":"hello %d"}],"max_tokens":8}}`+"\n",
			i, batchAPIEndpoint, i)
	}
	return b.Bytes()
}

// batchDeployment is a sluice on a fresh memory transport, not yet running.
func batchDeployment(gatewayURL string) (*memory.Transport, *app.App, error) {
	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 64, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(10 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: "results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: batchAPIQueue}, IGWBaseURL: gatewayURL}}},
	}
	a, err := newApp(cfg, app.Options{Transport: mem, Registry: prometheus.NewRegistry()})
	if err != nil {
		return nil, nil, err
	}
	return mem, a, nil
}

// runUntil runs fns (each until ctx ends) while body runs, then stops them
// and returns body's error, or else the first of theirs.
func runUntil(ctx context.Context, body func(context.Context) error, fns ...func(context.Context) error) error {
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, len(fns))
	for _, fn := range fns {
		go func() { errc <- fn(rctx) }()
	}
	err := body(ctx)
	cancel()
	for range fns {
		if e := <-errc; err == nil && e != nil && !errors.Is(e, context.Canceled) {
			err = e
		}
	}
	return err
}

// batchAPIRun is one run of the Batch API side: seconds from the upload's
// start to the output downloaded, and the output file.
func batchAPIRun(ctx context.Context, gatewayURL string, input []byte, clock *stageClock) (secs float64, out []byte, err error) {
	dir, err := os.MkdirTemp("", "sluice-bench-batch-")
	if err != nil {
		return 0, nil, err
	}
	defer os.RemoveAll(dir)
	mem, a, err := batchDeployment(gatewayURL)
	if err != nil {
		return 0, nil, err
	}
	diskFiles, err := disk.Open(disk.Config{Dir: filepath.Join(dir, "files")})
	if err != nil {
		return 0, nil, err
	}
	boltState, err := boltstate.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		return 0, nil, err
	}
	defer boltState.Close()
	// The seams wrapped only to note the stages' times (batchstages.go).
	state := stageState{State: boltState, c: clock}
	files := stageFiles{Store: diskFiles, c: clock}
	prod := stageProducer{Producer: memory.NewProducer(mem, submit.ReaderOptions{}), c: clock}
	// As serve builds it (cmd/sluice/batchapi.go): the front's defaults.
	svc, err := batch.New(batch.Config{Queue: batchAPIQueue}, state, files, prod, nil)
	if err != nil {
		return 0, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	base := "http://" + ln.Addr().String()
	serve := func(ctx context.Context) error {
		go func() { <-ctx.Done(); _ = srv.Close() }()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	outPath := filepath.Join(dir, "output.jsonl")
	err = runUntil(ctx, func(ctx context.Context) error {
		clock.restart()
		err := batchAPIJob(ctx, base, input, outPath, clock)
		secs = clock.elapsed().Seconds()
		return err
	}, a.Run, svc.Run, serve)
	if err != nil {
		return 0, nil, err
	}
	out, err = os.ReadFile(outPath) // for the check, after the clock stopped
	return secs, out, err
}

// batchAPIJob uploads input, creates a batch on it, waits for it to end
// and downloads its output file to outPath, as `sluice batch download`
// does (to a file: held in the bench's heap instead, the 20 MB buffer
// cost the client 10-90 ms of allocation and garbage collection, more
// than the download).
func batchAPIJob(ctx context.Context, base string, input []byte, outPath string, clock *stageClock) error {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, err := mw.CreateFormFile("file", "input.jsonl")
	if err != nil {
		return err
	}
	_, _ = fw.Write(input)
	_ = mw.Close()
	var file struct {
		ID string `json:"id"`
	}
	if err := batchHTTP(ctx, http.MethodPost, base+"/v1/files", mw.FormDataContentType(), &body, &file); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	clock.first("upload")
	create, _ := json.Marshal(map[string]string{"input_file_id": file.ID, "endpoint": batchAPIEndpoint, "completion_window": "24h"})
	var job struct {
		ID           string       `json:"id"`
		Status       string       `json:"status"`
		OutputFileID *string      `json:"output_file_id"`
		Counts       batch.Counts `json:"request_counts"`
	}
	if err := batchHTTP(ctx, http.MethodPost, base+"/v1/batches", "application/json", bytes.NewReader(create), &job); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	clock.first("created")
	deadline := time.Now().Add(5 * time.Minute)
	for !batch.Final(job.Status) {
		if time.Now().After(deadline) {
			return fmt.Errorf("batch %s still %s after 5m (%+v)", job.ID, job.Status, job.Counts)
		}
		if !sleep(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
		if err := batchHTTP(ctx, http.MethodGet, base+"/v1/batches/"+job.ID, "", nil, &job); err != nil {
			return fmt.Errorf("retrieve: %w", err)
		}
	}
	clock.first("polled")
	if job.Status != batch.StatusCompleted || job.OutputFileID == nil {
		return fmt.Errorf("batch %s ended %s (%+v)", job.ID, job.Status, job.Counts)
	}
	out, err := os.Create(outPath)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := batchHTTP(ctx, http.MethodGet, base+"/v1/files/"+*job.OutputFileID+"/content", "", nil, out); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	clock.first("downloaded")
	return nil
}

// batchHTTP makes one call; into is decoded JSON, or an io.Writer that
// gets the body as it is.
func batchHTTP(ctx context.Context, method, url, ctype string, body io.Reader, into any) error {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, b)
	}
	if w, ok := into.(io.Writer); ok {
		_, err = io.Copy(w, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// batchOutputFailures checks an output file: one line per custom_id
// req-0..n-1; it returns how many lines are missing, repeated or not a 200.
func batchOutputFailures(out []byte, n int) (int, error) {
	seen := make([]bool, n)
	bad := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Response *struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return 0, fmt.Errorf("output line: %w", err)
		}
		i, err := strconv.Atoi(l.CustomID[min(len(l.CustomID), len("req-")):])
		if err != nil || i < 0 || i >= n || seen[i] || l.Response == nil || l.Response.StatusCode != http.StatusOK {
			bad++
			continue
		}
		seen[i] = true
	}
	for _, s := range seen {
		if !s {
			bad++
		}
	}
	return bad, sc.Err()
}

// batchDirectRun is one run of the baseline: the lines of input turned
// into the requests the front would make, enqueued through core/submit in
// chunks of 1000, their results read from a route of their own and acked;
// seconds from the first line read to the last result acked, and the
// results that were not a 200 (or never came).
func batchDirectRun(ctx context.Context, gatewayURL string, input []byte, clock *stageClock) (secs float64, failed int, err error) {
	mem, a, err := batchDeployment(gatewayURL)
	if err != nil {
		return 0, 0, err
	}
	prod := memory.NewProducer(mem, submit.ReaderOptions{})
	const job, route, chunkSize = "direct", "sluice-batch:direct", 1000
	err = runUntil(ctx, func(ctx context.Context) error {
		clock.restart()
		r, err := prod.Results(ctx, route)
		if err != nil {
			return err
		}
		defer r.Close()
		deadline, created := time.Now().Add(24*time.Hour), time.Now()
		chunk := make([]*wire.Request, 0, chunkSize)
		sc := bufio.NewScanner(bytes.NewReader(input))
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		n := 0
		for sc.Scan() {
			var l struct {
				CustomID string          `json:"custom_id"`
				URL      string          `json:"url"`
				Body     json.RawMessage `json:"body"`
			}
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				return err
			}
			chunk = append(chunk, &wire.Request{ID: job + "-" + strconv.Itoa(n), Created: created, Deadline: deadline,
				Payload: l.Body, Metadata: map[string]string{"job_id": job, "custom_id": l.CustomID},
				Endpoint: l.URL, ResultQueueName: route, Model: "m1"})
			n++
			if len(chunk) == chunkSize {
				if err := prod.Enqueue(ctx, batchAPIQueue, chunk); err != nil {
					return err
				}
				chunk = chunk[:0]
			}
		}
		if len(chunk) > 0 {
			if err := prod.Enqueue(ctx, batchAPIQueue, chunk); err != nil {
				return err
			}
		}
		clock.first("last_enqueue")
		seen := make([]bool, n)
		got := 0
		for got < n {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			rs, err := r.Next(wctx)
			cancel()
			if err != nil {
				return fmt.Errorf("results after %d of %d: %w", got, n, err)
			}
			clock.first("first_result")
			for _, res := range rs {
				i := -1
				if res.Result != nil && len(res.ID) > len(job)+1 {
					i, _ = strconv.Atoi(res.ID[len(job)+1:])
				}
				if i < 0 || i >= n || seen[i] || res.Result.StatusCode != http.StatusOK {
					failed++
					continue
				}
				seen[i] = true
				got++
			}
			if err := r.Ack(ctx, rs...); err != nil {
				return err
			}
		}
		secs = clock.elapsed().Seconds()
		clock.first("done")
		return nil
	}, a.Run)
	return secs, failed, err
}
