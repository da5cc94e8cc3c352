package poolsim

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The vllm-8b-h100 preset against BLIS (inference-sim), the simulator whose
// step model it takes, on BLIS's own kind of workload: one pod, the same
// requests at the same times, and the figures BLIS reports computed BLIS's
// way (docs/simulate-pool.md, "Against BLIS"). Every request's TTFT and
// E2E was also compared (not kept here): equal in the sameSteps runs.
//
// The BLIS figures were measured with inference-sim at commit
// b563c4405b7847eaf682c6d603065c1faca3ca03 (the last before 90522ded removed
// the blackbox latency model), built with `go build -o blis .` and run as
//
//	blis run --latency-model blackbox --model meta-llama/llama-3.1-8b-instruct \
//	  --hardware H100 --tp 1 --beta-coeffs 5753,17.25,6 --alpha-coeffs 230,0,0 \
//	  --total-kv-blocks 29205 --block-size-in-tokens 16 --max-num-running-reqs 1024 \
//	  --max-num-scheduled-tokens 8192 --max-model-len 8192 --num-instances 1 --seed 42 \
//	  --trace-output NAME --metrics-path NAME.json --log debug WORKLOAD
//
// with WORKLOAD one of
//
//	fixed50:   --workload-spec S, S a v2 spec: seed 42, aggregate_rate 35.6,
//	           num_requests 2000, one client with rate_fraction 1, arrival
//	           process poisson, input_distribution constant 512,
//	           output_distribution constant 256
//	fixed90:   the same with aggregate_rate 64.2
//	chatbot:   --workload chatbot --rate 40 --num-requests 1000 (defaults.yaml's
//	           chatbot: prompts 256 ± 100 in [2, 800], outputs 256 ± 100 in
//	           [1, 1024]; BLIS's named workloads arrive at a constant rate)
//	chatbot17: chatbot with --beta-coeffs 5753,17,6 (same requests)
//
// Alpha: BLIS delays an arrival by α0 + α1·prompt tokens before it reaches
// the queue and adds α2 to every token's time; the preset has only its
// 230 µs request overhead, hence 230,0,0. The rates are 50 % and 90 % of a
// pod's capacity at 512/256 (18,246 output tokens/s on the virtual clock,
// docs/simulate-pool.md: 71.3 requests/s). BLIS does prefix caching on
// token ids; its generated prompts are random ids, so nothing hits, as
// nothing hits here (a replayed arrival has no text).
//
// testdata/blis/NAME.csv is the request sequence BLIS generated and ran
// (from its --trace-output: arrival_time_us, input_tokens, output_tokens;
// chatbot17's is chatbot's). The figures are BLIS's metrics JSON
// (ttft_mean_ms, ttft_p99_ms, e2e_mean_ms, tokens_per_sec: output tokens
// over vllm_estimated_duration_s, the last step's end) and, from its debug
// log, the steps ("<< StepEvent at T ticks" lines) and the first step's
// start. BLIS reports no step time; both sides take the mean step as
// (last step's end − first step's start) / steps: the pod is busy from
// its first request to its last at these loads.
type blisRun struct {
	name, trace string
	// prefillPerToken replaces the preset's β1 (0: keep it).
	prefillPerToken time.Duration
	// BLIS's figures.
	ttftMeanMs, ttftP99Ms, e2eMeanMs, tokensPerSec float64
	endUs, firstStepUs                             int64
	steps                                          int
	// sameSteps: every step's cost is a whole number of microseconds, so
	// BLIS's truncation of a step to whole microseconds (int64 of
	// β0 + β1·p + β2·d) changes nothing and both simulators must run the
	// same steps: same count, figures within rounding. Otherwise BLIS's
	// steps are up to 0.75 µs shorter (17.25·p for p not a multiple of 4),
	// the step boundaries drift apart by up to ~0.4 ms over the run, an
	// arrival can then catch a different step (chatbot: 39 of 1,000, TTFT
	// up to 6.2 ms apart) while the figures agree within 0.32 %; held to
	// the 10 %.
	sameSteps bool
}

var blisRuns = []blisRun{
	{name: "fixed50", trace: "fixed50", ttftMeanMs: 25.1880585, ttftP99Ms: 56.26832, e2eMeanMs: 2371.6431225,
		tokensPerSec: 8936.518047717096, endUs: 57293008, firstStepUs: 14446, steps: 6354, sameSteps: true},
	{name: "fixed90", trace: "fixed90", ttftMeanMs: 42.4156405, ttftP99Ms: 115.10525, e2eMeanMs: 4400.5807165,
		tokensPerSec: 15685.87899882304, endUs: 32640823, firstStepUs: 8113, steps: 2070, sameSteps: true},
	{name: "chatbot", trace: "chatbot", ttftMeanMs: 14.019167, ttftP99Ms: 19.76074, e2eMeanMs: 1911.706713,
		tokensPerSec: 9284.128135827212, endUs: 27337085, firstStepUs: 25229, steps: 3699},
	{name: "chatbot17", trace: "chatbot", prefillPerToken: 17 * time.Microsecond, ttftMeanMs: 14.006197, ttftP99Ms: 18.911,
		e2eMeanMs: 1905.5404, tokensPerSec: 9284.729975471655, endUs: 27335313, firstStepUs: 25229, steps: 3710, sameSteps: true},
}

// blisFigures are the figures compared.
type blisFigures struct {
	ttftMean, ttftP99, e2eMean time.Duration
	tokensPerSec               float64
	meanStep                   time.Duration
	steps                      int
	// preemptions: BLIS's preemption_count, 0 in every run (the KV cache
	// never fills).
	preemptions int
}

func (r blisRun) figures() blisFigures {
	fromMs := func(v float64) time.Duration { return time.Duration(math.Round(v * 1e6)) }
	return blisFigures{ttftMean: fromMs(r.ttftMeanMs), ttftP99: fromMs(r.ttftP99Ms), e2eMean: fromMs(r.e2eMeanMs),
		tokensPerSec: r.tokensPerSec, meanStep: time.Duration(r.endUs-r.firstStepUs) * time.Microsecond / time.Duration(r.steps),
		steps: r.steps}
}

// readBLISTrace reads testdata/blis/name.csv as one interactive arrival a
// row.
func readBLISTrace(t testing.TB, name string) []Arrival {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "blis", name+".csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Arrival
	sc := bufio.NewScanner(f)
	for line := 0; sc.Scan(); line++ {
		if line == 0 {
			if sc.Text() != "arrival_us,prompt_tokens,output_tokens" {
				t.Fatalf("%s.csv: header %q", name, sc.Text())
			}
			continue
		}
		var v [3]int
		for i, s := range strings.Split(sc.Text(), ",") {
			if i >= len(v) {
				t.Fatalf("%s.csv:%d: %q", name, line+1, sc.Text())
			}
			if v[i], err = strconv.Atoi(s); err != nil {
				t.Fatalf("%s.csv:%d: %v", name, line+1, err)
			}
		}
		out = append(out, Arrival{At: time.Duration(v[0]) * time.Microsecond, PromptTokens: v[1], MaxTokens: v[2]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// blisPercentile is BLIS's CalculatePercentile: linear interpolation
// between the closest ranks of the sorted data.
func blisPercentile(sorted []time.Duration, p float64) time.Duration {
	rank := p / 100 * float64(len(sorted)-1)
	lo, hi := int(math.Floor(rank)), int(math.Ceil(rank))
	return sorted[lo] + time.Duration(float64(sorted[hi]-sorted[lo])*(rank-float64(lo)))
}

// poolsimFigures replays the arrivals on one vllm-8b-h100 pod (β1
// prefillPerToken unless 0) and computes BLIS's figures from the traces; a
// step is counted by the tokens it ends with (every step here makes one).
func poolsimFigures(t testing.TB, arrivals []Arrival, prefillPerToken time.Duration) blisFigures {
	t.Helper()
	p, err := PresetByName(PresetVLLM8BH100)
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config
	cfg.Pods, cfg.Seed, cfg.Engine.StepJitter = 1, 1, 0
	if prefillPerToken > 0 {
		cfg.Engine.PrefillPerToken = prefillPerToken
	}
	traces, err := Replay(cfg, arrivals)
	if err != nil {
		t.Fatal(err)
	}
	var ttft []time.Duration
	var ttftSum, e2eSum, end time.Duration
	first := time.Duration(math.MaxInt64)
	stepEnds := map[time.Duration]bool{}
	tokens, preemptions := 0, 0
	for i, tr := range traces {
		a := arrivals[i]
		if len(tr.Tokens) != a.MaxTokens {
			t.Fatalf("arrival %d: %d tokens, want %d", i, len(tr.Tokens), a.MaxTokens)
		}
		ttft = append(ttft, tr.TTFT(a))
		ttftSum += ttft[i]
		e2eSum += tr.Tokens[len(tr.Tokens)-1] - a.At
		end = max(end, tr.Tokens[len(tr.Tokens)-1])
		first = min(first, tr.FirstScheduled)
		tokens += len(tr.Tokens)
		preemptions += tr.Preemptions
		for _, at := range tr.Tokens {
			stepEnds[at] = true
		}
	}
	slices.Sort(ttft)
	n := time.Duration(len(traces))
	return blisFigures{
		ttftMean:     ttftSum / n,
		ttftP99:      blisPercentile(ttft, 99),
		e2eMean:      e2eSum / n,
		tokensPerSec: float64(tokens) / end.Seconds(),
		meanStep:     (end - first) / time.Duration(len(stepEnds)),
		steps:        len(stepEnds),
		preemptions:  preemptions,
	}
}

// TestCalibrateAgainstBLIS replays BLIS's workloads on one vllm-8b-h100
// pod and holds its figures to BLIS's: within 10 % (the bound),
// and within rounding with the same number of steps where both must run
// the same steps (blisRun.sameSteps).
func TestCalibrateAgainstBLIS(t *testing.T) {
	for _, r := range blisRuns {
		t.Run(r.name, func(t *testing.T) {
			got := poolsimFigures(t, readBLISTrace(t, r.trace), r.prefillPerToken)
			want := r.figures()
			if got.preemptions != want.preemptions {
				t.Errorf("%d preemptions, BLIS %d", got.preemptions, want.preemptions)
			}
			tol := 0.10
			if r.sameSteps {
				tol = 1e-5 // microsecond rounding of BLIS's figures
				if got.steps != want.steps {
					t.Errorf("%d steps, BLIS %d", got.steps, want.steps)
				}
			}
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"TTFT mean (ms)", blisMs(got.ttftMean), blisMs(want.ttftMean)},
				{"TTFT p99 (ms)", blisMs(got.ttftP99), blisMs(want.ttftP99)},
				{"E2E mean (ms)", blisMs(got.e2eMean), blisMs(want.e2eMean)},
				{"throughput (output tokens/s)", got.tokensPerSec, want.tokensPerSec},
				{"mean step (ms)", blisMs(got.meanStep), blisMs(want.meanStep)},
			} {
				d := c.got/c.want - 1
				t.Logf("%-28s BLIS %10.3f  poolsim %10.3f  %+.3f %%", c.what, c.want, c.got, 100*d)
				if math.Abs(d) > tol {
					t.Errorf("%s: poolsim %.3f, BLIS %.3f: %+.3f %%, beyond %.3g %%", c.what, c.got, c.want, 100*d, 100*tol)
				}
			}
		})
	}
}

func blisMs(d time.Duration) float64 { return float64(d) / 1e6 }
