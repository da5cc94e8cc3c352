package poolsim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCalibrate measures the default pool in real time on this
// machine: the idle TTFT of a 256/64 interactive request and the service
// time of a 512/256 batch request, then a full-load phase (POOLSIM_LOAD_S
// seconds, default 20: 64 batch clients looping 512/256, interactive
// streams of 256/64 at 10/s) with the step lag, the batch throughput, the
// interactive TTFT and the CPU the simulator used. Run it with
//
//	go test -run '^$' -bench Calibrate -benchtime 1x ./internal/poolsim
func BenchmarkCalibrate(b *testing.B) {
	loadFor := 20 * time.Second
	if v := os.Getenv("POOLSIM_LOAD_S"); v != "" {
		s, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("POOLSIM_LOAD_S=%q: %v", v, err)
		}
		loadFor = time.Duration(s) * time.Second
	}
	for range b.N {
		p, base, c := startPool(b, Config{Seed: 1})
		tr := c.Transport.(*http.Transport)
		tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = 0, 128

		// Idle figures, the median of 5 of each.
		var idleTTFT, idleServerTTFT, batchService []time.Duration
		for range 5 {
			client, server, _ := streamTTFT(b, c, base)
			idleTTFT, idleServerTTFT = append(idleTTFT, client), append(idleServerTTFT, server)
			start := time.Now()
			resp, body := post(b, c, base+PathCompletions, `{"prompt":"x","max_tokens":256}`,
				HeaderPromptTokens, "512", HeaderObjective, "batch-sheddable")
			if resp.StatusCode != 200 {
				b.Fatalf("batch request: %d %s", resp.StatusCode, body)
			}
			batchService = append(batchService, time.Since(start))
		}

		// Full load.
		p.ResetStats()
		gen0 := generated(p)
		cpu0 := cpuTime()
		ctx, stop := context.WithTimeout(context.Background(), loadFor)
		var wg sync.WaitGroup
		var batchTokens atomic.Int64
		for range 64 {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+PathCompletions,
						strings.NewReader(`{"prompt":"x","max_tokens":256}`))
					req.Header.Set(HeaderPromptTokens, "512")
					req.Header.Set(HeaderObjective, "batch-sheddable")
					resp, err := c.Do(req)
					if err != nil {
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						batchTokens.Add(256)
					}
				}
			})
		}
		var mu sync.Mutex
		var loadTTFT, loadServerTTFT []time.Duration
		tick := time.NewTicker(100 * time.Millisecond)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-tick.C:
				wg.Go(func() {
					client, server, ok := streamTTFT(b, c, base)
					if ok {
						mu.Lock()
						loadTTFT, loadServerTTFT = append(loadTTFT, client), append(loadServerTTFT, server)
						mu.Unlock()
					}
				})
			}
		}
		tick.Stop()
		stop()
		poolTokens := generated(p) - gen0
		cpu := cpuTime() - cpu0
		wg.Wait()
		st := p.Stats()
		lag := st.StepLag

		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(ms(median(idleTTFT)), "idle_ttft_ms")
		b.ReportMetric(ms(median(idleServerTTFT)), "idle_server_ttft_ms")
		b.ReportMetric(ms(median(batchService)), "idle_batch_service_ms")
		b.ReportMetric(ms(lag.P50), "load_step_lag_p50_ms")
		b.ReportMetric(ms(lag.P99), "load_step_lag_p99_ms")
		b.ReportMetric(ms(lag.Max), "load_step_lag_max_ms")
		b.ReportMetric(float64(batchTokens.Load())/loadFor.Seconds(), "load_batch_tokens/s")
		b.ReportMetric(float64(poolTokens)/loadFor.Seconds(), "load_pool_tokens/s")
		b.ReportMetric(ms(quantile(loadTTFT, 0.5)), "load_ttft_p50_ms")
		b.ReportMetric(ms(quantile(loadTTFT, 0.99)), "load_ttft_p99_ms")
		b.ReportMetric(ms(quantile(loadServerTTFT, 0.99)), "load_server_ttft_p99_ms")
		b.ReportMetric(cpu.Seconds()/loadFor.Seconds(), "load_cpu_cores")
		b.Logf("load: %d steps, %d interactive streams, preemptions %d, stats %+v",
			lag.Steps, len(loadTTFT), st.Classes[ClassBatch].Preemptions+st.Classes[ClassInteractive].Preemptions, st.Classes)
	}
}

// streamTTFT sends one streamed 256/64 interactive request and returns its
// client-side TTFT (to the first token event) and the server's
// X-Sim-Ttft-Ms.
func streamTTFT(b testing.TB, c *http.Client, base string) (client, server time.Duration, ok bool) {
	req, _ := http.NewRequest(http.MethodPost, base+PathCompletions, strings.NewReader(`{"prompt":"x","max_tokens":64,"stream":true}`))
	req.Header.Set(HeaderPromptTokens, "256")
	req.Header.Set(HeaderObjective, "interactive-default")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, false
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, 0, false
		}
		if strings.HasPrefix(line, "data: {") {
			client = time.Since(start)
			break
		}
	}
	_, _ = io.Copy(io.Discard, r)
	msf, err := strconv.ParseFloat(resp.Header.Get(HeaderTTFTMS), 64)
	if err != nil {
		b.Errorf("%s: %v", HeaderTTFTMS, err)
	}
	return client, time.Duration(msf * float64(time.Millisecond)), true
}

func median(d []time.Duration) time.Duration { return quantile(d, 0.5) }

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[rank(len(s), q)]
}

// generated is vllm:generation_tokens_total summed over the pods.
func generated(p *Pool) uint64 {
	var n uint64
	for _, d := range p.pods {
		d.mu.Lock()
		n += d.m.generationTokens
		d.mu.Unlock()
	}
	return n
}

// cpuTime is the CPU (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
