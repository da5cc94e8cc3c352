package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-io/sluice/internal/testenv"
)

// setGate puts a gate on the (only) queue of a deployment.
func setGate(cfg sluiceConfig, gateType string, params map[string]any) {
	tc := cfg["transport_config"].(map[string]any)
	q := tc["queues"].([]map[string]any)[0]
	q["gate_type"] = gateType
	q["gate_params"] = params
}

// childOf returns the pid of a process whose parent is ppid and whose
// executable is exe (0: none).
func childOf(ppid int, exe string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		if p, _ := os.Readlink("/proc/" + e.Name() + "/exe"); p == exe {
			return pid
		}
	}
	return 0
}

// metricSum sums the samples of a metric whose line contains every one of
// parts, from a /metrics endpoint.
func metricSum(url string, parts ...string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if !ok {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if x, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += x
			}
		}
	}
	return sum
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// runPluginKill: one sorted-set replica whose queue is gated by the example
// gate plugin with admit on (every request asks the plugin); under load the
// plugin process is killed (SIGKILL) 10 times, each time once the host has
// restarted it. An admission that fails defers the request (docs/gates.md),
// so nothing may be lost, dropped or answered twice.
func runPluginKill(ctx context.Context, e *env) *verdict {
	tc := transportCases()[0]
	s, v := open(ctx, e, "plugin-kill", tc, brokerTweak{}, gatewayFaults{latencyMin: 100 * time.Millisecond, latencyMax: 200 * time.Millisecond})
	if s == nil {
		return v
	}
	defer s.close()
	budget := filepath.Join(s.r.dir, "budget")
	if err := os.WriteFile(budget, []byte("1\n"), 0o600); err != nil {
		v.fail("budget file: %v", err)
		return v
	}
	cfg := baseConfig(s.b, s.gw.URL, 16)
	metricsPort := freePort()
	cfg["metrics_port"] = metricsPort
	setGate(cfg, "plugin", map[string]any{"path": e.plugin, "file": budget, "admit": "true", "failure_policy": "closed"})
	cfgPath, err := s.r.writeConfig(cfg)
	if err != nil {
		v.fail("config: %v", err)
		return v
	}
	p, err := s.r.startReady(ctx, cfgPath)
	if err != nil {
		v.fail("%v", err)
		return v
	}
	const n, kills = 3000, 10
	if err := s.send(ctx, s.goodMessages("p", n, 10*time.Minute)); err != nil {
		v.fail("send: %v", err)
		return v
	}
	killed := 0
	seen := map[int]bool{}
	for k := 0; k < kills && ctx.Err() == nil; k++ {
		// Wait for the restarted plugin (restart_backoff 500 ms, doubling
		// while starts fail, up to 30 s), and let it answer for a second:
		// a plugin killed before its first answer counts as a failed start
		// and doubles the backoff.
		pid := 0
		for end := time.Now().Add(40 * time.Second); time.Now().Before(end); {
			if pid = childOf(p.cmd.Process.Pid, e.plugin); pid != 0 && !seen[pid] {
				break
			}
			sleep(ctx, 20*time.Millisecond)
		}
		if pid == 0 || seen[pid] {
			v.fail("kill %d: no new plugin process under sluice within 40 s", k+1)
			break
		}
		seen[pid] = true
		sleep(ctx, time.Second)
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed++
		}
	}
	answeredAtLastKill := s.l.tally().answered
	if !s.waitComplete(ctx, 90*time.Second) {
		v.fail("not every request answered 90 s after the last kill")
	}
	s.quiet(ctx, 2*time.Second, 4*time.Second)
	murl := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	v.extra["plugin_losses"] = metricSum(murl, "sluice_gate_events_total", `event="plugin_losses"`)
	v.extra["plugin_starts"] = metricSum(murl, "sluice_gate_events_total", `event="plugin_starts"`)
	s.checkCrashes()
	if _, err := p.term(30 * time.Second); err != nil {
		v.fail("%v", err)
	}
	v.t = s.l.tally()
	v.judge(0)
	v.extra["plugin_kills"] = float64(killed)
	v.extra["answered_at_last_kill"] = float64(answeredAtLastKill)
	s.l.mu.Lock()
	ok := s.l.codes["ok"]
	s.l.mu.Unlock()
	if ok != v.t.requests {
		v.fail("%d of %d results are not a 200 answer (a failed admission must defer, not drop)", v.t.requests-ok, v.t.requests)
	}
	s.l.codeFigures(v.extra)
	return v
}

// saturationTarget serves the EPP saturation gauge the prometheus gate reads.
func saturationTarget() (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "# TYPE inference_extension_flow_control_pool_saturation gauge\ninference_extension_flow_control_pool_saturation{inference_pool=\"chaos\"} 0.1\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String() + "/metrics", nil
}

// runPrometheusGone: a sorted-set replica gated by prometheus-saturation
// (saturation 0.1, threshold 0.8: budget 0.7) is under load when
// prometheus is killed for 10 s and started again on the same port and
// data. Run twice: failure_policy closed (dispatch must stop — no call may
// start once the gate has seen the failure, allowed 2 s: the 1 s answer
// cache, the 100 ms refresh and the query timeout — and resume once
// prometheus is back) and open (dispatch must go on). Nothing may be lost.
func runPrometheusGone(ctx context.Context, e *env) *verdict {
	total := &verdict{extra: figures{}}
	l := newLedger(true) // the gateway answers 200
	for _, policy := range []string{"closed", "open"} {
		v := prometheusGone(ctx, e, policy, l)
		for k, x := range v.extra {
			total.extra[policy+"_"+k] = x
		}
		for _, f := range v.failures {
			total.fail("%s: %s", policy, f)
		}
	}
	total.t = l.tally()
	total.judge(0)
	return total
}

func prometheusGone(ctx context.Context, e *env, policy string, all *ledger) *verdict {
	tc := transportCases()[0]
	s, v := open(ctx, e, "prometheus-gone-"+policy, tc, brokerTweak{}, gatewayFaults{latencyMin: 50 * time.Millisecond, latencyMax: 100 * time.Millisecond})
	if s == nil {
		return v
	}
	defer s.close()
	target, turl, err := saturationTarget()
	if err != nil {
		v.fail("target: %v", err)
		return v
	}
	defer target.Close()
	pdir := filepath.Join(s.r.dir, "prometheus")
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		v.fail("%v", err)
		return v
	}
	popts := testenv.PrometheusOptions{Targets: []testenv.ScrapeTarget{{URL: turl}}, ScrapeInterval: time.Second}
	prom, err := testenv.StartPrometheusProcess(popts, 0, pdir)
	if err != nil {
		v.fail("%v", err)
		return v
	}
	defer func() { prom.Stop() }()
	_, portS, _ := net.SplitHostPort(strings.TrimPrefix(prom.URL, "http://"))
	port, _ := strconv.Atoi(portS)

	cfg := baseConfig(s.b, s.gw.URL, 16)
	cfg["prometheus"] = map[string]any{"url": prom.URL, "cache_ttl": "1s"}
	setGate(cfg, "prometheus-saturation", map[string]any{"pool": "chaos", "threshold": 0.8, "failure_policy": policy})
	cfgPath, err := s.r.writeConfig(cfg)
	if err != nil {
		v.fail("config: %v", err)
		return v
	}
	p, err := s.r.startReady(ctx, cfgPath)
	if err != nil {
		v.fail("%v", err)
		return v
	}
	const n = 2000
	if err := s.send(ctx, s.goodMessages("m-"+policy, n, 10*time.Minute)); err != nil {
		v.fail("send: %v", err)
		return v
	}
	sleep(ctx, 3*time.Second)
	goneAt := time.Now()
	prom.Stop()
	sleep(ctx, 10*time.Second)
	backAt := time.Now()
	prom2, err := testenv.StartPrometheusProcess(popts, port, pdir)
	if err != nil {
		v.fail("restart prometheus: %v", err)
		return v
	}
	prom = prom2
	readyAt := time.Now()
	if !s.waitComplete(ctx, 120*time.Second) {
		v.fail("not every request answered 120 s after prometheus came back")
	}
	s.quiet(ctx, 2*time.Second, 4*time.Second)
	s.checkCrashes()
	if _, err := p.term(30 * time.Second); err != nil {
		v.fail("%v", err)
	}
	const grace = 2 * time.Second
	whileGone, firstAfter := 0, time.Time{}
	for _, as := range s.gw.snapshot() {
		for _, c := range as {
			if c.start.After(goneAt.Add(grace)) && c.start.Before(backAt) {
				whileGone++
			}
			if c.start.After(backAt) && (firstAfter.IsZero() || c.start.Before(firstAfter)) {
				firstAfter = c.start
			}
		}
	}
	v.extra["calls_while_gone"] = float64(whileGone)
	v.extra["restart_seconds"] = readyAt.Sub(backAt).Seconds()
	if !firstAfter.IsZero() {
		v.extra["resumed_seconds"] = firstAfter.Sub(backAt).Seconds()
	}
	switch {
	case policy == "closed" && whileGone > 0:
		v.fail("fail-closed gate: %d calls started while prometheus was gone", whileGone)
	case policy == "open" && whileGone == 0:
		v.fail("fail-open gate: no call started while prometheus was gone")
	}
	t := s.l.tally()
	v.extra["lost"] = float64(t.lost)
	// Into the combined ledger: every expectation, every result with its
	// code, every result for an id never sent.
	all.merge(s.l)
	return v
}
