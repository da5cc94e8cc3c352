package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

// gatewayChildEnv runs this program as a gateway simulator only (value:
// "latency_ms,capacity[,warmup_requests,protocol]"), so that a scenario can
// measure sluice's process alone: a real gateway is another process too.
const gatewayChildEnv = "SLUICE_BENCH_GATEWAY_CHILD"

// gatewayStatsPath serves the child gateway's counters as JSON.
const gatewayStatsPath = "/bench/stats"

type gatewayStats struct {
	Arrivals int64 `json:"arrivals"`
	MaxIn    int64 `json:"max_inflight"`
	Conns    int64 `json:"conns"`
	// HandlerMs is the mean time a request spent in the gateway's handler.
	HandlerMs float64 `json:"handler_ms"`
	// WarmupCPU is the CPU seconds the child spent warming up.
	WarmupCPU float64 `json:"warmup_cpu"`
	// FirstUnixNano is when the first request (after the warm-up) arrived.
	FirstUnixNano int64 `json:"first_unix_nano"`
	// Waves describes the rounds of calls (when asked with ?wave=size).
	Waves *waveStats `json:"waves,omitempty"`
}

// waveStats describes the rounds ("waves") of a fixed-latency run, from
// the times requests arrived at the gateway. The first wave is dispatched
// as fast as sluice can; each later wave is the previous one's results
// turned into new calls. Its first arrival moves by HeadCycleMs per round
// and its last by TailCycleMs: the difference is how fast the wave spreads
// out, and the end of the run is roughly the last wave's last arrival plus
// one gateway latency.
type waveStats struct {
	FirstSpreadMs float64 `json:"first_spread_ms"` // first to last arrival of wave 1
	LastSpreadMs  float64 `json:"last_spread_ms"`  // the same for the last complete wave
	HeadCycleMs   float64 `json:"head_cycle_ms"`   // mean time between the waves' first arrivals
	TailCycleMs   float64 `json:"tail_cycle_ms"`   // mean time between the waves' last arrivals
}

// runGatewayChild serves the simulator until standard input closes.
func runGatewayChild(spec string) error {
	f := strings.Split(spec, ",")
	if len(f) != 2 && len(f) != 4 {
		return fmt.Errorf("%s=%q: want latency_ms,capacity[,warmup_requests,protocol]", gatewayChildEnv, spec)
	}
	ms, err := strconv.Atoi(f[0])
	if err != nil {
		return err
	}
	c, err := strconv.Atoi(f[1])
	if err != nil {
		return err
	}
	g, err := startGateway(simulator.Config{Latency: simulator.Fixed(time.Duration(ms) * time.Millisecond), Capacity: c})
	if err != nil {
		return err
	}
	defer g.close()
	if dir := os.Getenv("SLUICE_BENCH_PROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, "gateway.cpu.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if len(f) == 4 {
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return err
		}
		if err := g.warmUp(n, f[3]); err != nil {
			return fmt.Errorf("gateway warm-up: %w", err)
		}
		g.warmupCPU = cpuSeconds()
	}
	fmt.Println("LISTEN", g.url)
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes stdin to stop us
	return nil
}

// gatewayProcess is a simulator running in a child process.
type gatewayProcess struct {
	url   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startGatewayProcess starts a gateway child. With warmup > 0 the child
// first serves that many concurrent requests (200 ms each, over protocol)
// from a client of its own and only then reports ready, its counters reset:
// the gateway a deployment talks to is a long-running, warm process, while a
// fresh child would spend the first wave faulting in memory (stacks, buffers)
// on the CPU the measured process needs.
func startGatewayProcess(ctx context.Context, latency time.Duration, capacity, warmup int, protocol string) (*gatewayProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	spec := fmt.Sprintf("%d,%d", latency.Milliseconds(), capacity)
	if warmup > 0 {
		spec += fmt.Sprintf(",%d,%s", warmup, protocol)
	}
	cmd.Env = append(os.Environ(), gatewayChildEnv+"="+spec)
	testenv.DieWithParent(cmd)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	if err != nil || !ok {
		_ = stdin.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("gateway child: %q: %v", line, err)
	}
	return &gatewayProcess{url: url, cmd: cmd, stdin: stdin}, nil
}

func (g *gatewayProcess) stats() (gatewayStats, error) { return g.statsQuery("") }

// statsQuery is stats with a query string ("?wave=5000").
func (g *gatewayProcess) statsQuery(q string) (gatewayStats, error) {
	var s gatewayStats
	resp, err := http.Get(g.url + gatewayStatsPath + q)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// stop ends the child and returns the CPU seconds (user+system) it used.
func (g *gatewayProcess) stop() float64 {
	if g.cmd.ProcessState != nil {
		return processCPU(g.cmd.ProcessState)
	}
	_ = g.stdin.Close()
	done := make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-done
	}
	return processCPU(g.cmd.ProcessState)
}

func processCPU(ps *os.ProcessState) float64 {
	if ps == nil {
		return 0
	}
	return (ps.UserTime() + ps.SystemTime()).Seconds()
}

// cpu reads the child's CPU seconds so far from /proc (trace output only).
func (g *gatewayProcess) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", g.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

// warmUp sends n concurrent requests of 200 ms to the gateway over protocol
// ("http1" or "h2c") and waits for them, then resets the counters.
func (g *gateway) warmUp(n int, protocol string) error {
	tr, err := clientTransport(protocol, n)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := []byte(`{"model":"m","prompt":"warm-up","max_tokens":1}`)
	header := http.Header{"Content-Type": {"application/json"}, simulator.HeaderLatencyMS: {"200"}}
	errs := make(chan error, n)
	for range n {
		go func() { errs <- post(ctx, tr, g.url+simulator.PathCompletions, body, header) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	g.arrivals.Store(0)
	g.firstUnixNano.Store(0)
	g.maxIn.Store(0)
	g.conns.Store(0)
	for i := range g.arrivalLog {
		g.arrivalLog[i].Store(0)
	}
	g.servedNs.Store(0)
	g.served.Store(0)
	return first
}

// clientTransport is a plain net/http Transport speaking protocol to a
// gateway child: "http1", or "h2c" (HTTP/2 with prior knowledge). It keeps
// up to maxIdle idle HTTP/1.1 connections.
func clientTransport(protocol string, maxIdle int) (*http.Transport, error) {
	var p http.Protocols
	switch protocol {
	case "http1":
		p.SetHTTP1(true)
	case "h2c":
		p.SetUnencryptedHTTP2(true)
	default:
		return nil, fmt.Errorf("protocol %q", protocol)
	}
	return &http.Transport{Protocols: &p, DisableCompression: true, MaxIdleConnsPerHost: maxIdle}, nil
}

// post POSTs body to url with header (shared, read-only) and reads the
// answer to its end; an answer other than 200 is an error.
func post(ctx context.Context, rt http.RoundTripper, url string, body []byte, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = header
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
