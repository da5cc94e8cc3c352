package main

import (
	"bufio"
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

	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/simulator"
)

// gatewayChildEnv runs this program as a gateway simulator only (value:
// "latency_ms,capacity"), so that a scenario can measure sluice's process
// alone: a real gateway is another process too.
const gatewayChildEnv = "SLUICE_BENCH_GATEWAY_CHILD"

// gatewayStatsPath serves the child gateway's counters as JSON.
const gatewayStatsPath = "/bench/stats"

type gatewayStats struct {
	Arrivals int64 `json:"arrivals"`
	MaxIn    int64 `json:"max_inflight"`
	Conns    int64 `json:"conns"`
}

// runGatewayChild serves the simulator until standard input closes.
func runGatewayChild(spec string) error {
	lat, capacity, ok := strings.Cut(spec, ",")
	if !ok {
		return fmt.Errorf("%s=%q: want latency_ms,capacity", gatewayChildEnv, spec)
	}
	ms, err := strconv.Atoi(lat)
	if err != nil {
		return err
	}
	c, err := strconv.Atoi(capacity)
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

func startGatewayProcess(ctx context.Context, latency time.Duration, capacity int) (*gatewayProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d", gatewayChildEnv, latency.Milliseconds(), capacity))
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

func (g *gatewayProcess) stats() (gatewayStats, error) {
	var s gatewayStats
	resp, err := http.Get(g.url + gatewayStatsPath)
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
