package poolsim

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestPresetByName(t *testing.T) {
	if got := PresetNames(); strings.Join(got, ",") != "stress,vllm-8b-h100,vllm-8b-h100-16" {
		t.Fatalf("presets %v", got)
	}
	_, err := PresetByName("vllm-70b")
	if err == nil || !strings.Contains(err.Error(), `"vllm-70b"`) || !strings.Contains(err.Error(), "stress, vllm-8b-h100, vllm-8b-h100-16") {
		t.Fatalf("unknown preset: %v, want an error naming it and listing the presets", err)
	}
	stress, err := PresetByName(PresetStress)
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	c.SetDefaults()
	s := stress.Config
	s.SetDefaults()
	if s.Engine != c.Engine || s.Pods != c.Pods {
		t.Fatalf("stress %+v is not the default pool %+v", s.Engine, c.Engine)
	}
	for _, p := range Presets() {
		if err := p.Config.Validate(); err != nil {
			t.Errorf("preset %s: %v", p.Name, err)
		}
		if p.RateScale <= 0 || p.BatchConcurrency <= 0 || p.Doc == "" {
			t.Errorf("preset %s: rate scale %v, batch concurrency %d, doc %q", p.Name, p.RateScale, p.BatchConcurrency, p.Doc)
		}
	}
}

// The vLLM presets are BLIS's Llama-3.1-8B/H100 model at vLLM's defaults:
// their step is β0 + β1·uncached prefill tokens + β2·decode tokens, with
// neither the load factor nor a charge per prefill start, and the KV cache
// is 29,205 blocks of 16 tokens.
func TestPresetVLLMStep(t *testing.T) {
	for _, name := range []string{PresetVLLM8BH100, PresetVLLM8BH100Seats16} {
		p, err := PresetByName(name)
		if err != nil {
			t.Fatal(err)
		}
		c := p.Config
		c.SetDefaults()
		e := c.Engine
		if e.KVTokens != 29205*16 || e.MaxNumBatchedTokens != 8192 || e.DisableChunkedPrefill || !e.PrefixCaching {
			t.Fatalf("%s: KV %d tokens, budget %d, chunked %v, prefix caching %v", name, e.KVTokens, e.MaxNumBatchedTokens, !e.DisableChunkedPrefill, e.PrefixCaching)
		}
		eng := newEngine(e, newRNG(1, 0))
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		for _, tc := range []struct{ n, p, k, d int }{{1, 0, 0, 1}, {16, 0, 0, 16}, {1, 256, 1, 0}, {16, 2000, 3, 13}} {
			want := 5753 + 17.25*float64(tc.p) + 6*float64(tc.d)
			if got := us(eng.stepTime(tc.n, tc.p, tc.k, tc.d)); math.Abs(got-want) > 0.01 {
				t.Errorf("%s: step of %+v = %.2f µs, want %.2f", name, tc, got, want)
			}
		}
	}
	if p, _ := PresetByName(PresetVLLM8BH100); p.Config.Engine.MaxNumSeqs != 1024 {
		t.Fatalf("vllm-8b-h100 has %d seats, want vLLM's default 1,024", p.Config.Engine.MaxNumSeqs)
	}
	if p, _ := PresetByName(PresetVLLM8BH100Seats16); p.Config.Engine.MaxNumSeqs != 16 {
		t.Fatalf("vllm-8b-h100-16 has %d seats, want 16", p.Config.Engine.MaxNumSeqs)
	}
}

// A prefix-cache hit costs nothing for its cached tokens, and on the
// linear step model nothing for its start: a continuation's first step
// costs β0 + β1 × its uncached tokens only.
func TestPresetCacheHitIsFree(t *testing.T) {
	p, _ := PresetByName(PresetVLLM8BH100)
	c := p.Config
	c.SetDefaults()
	e := newEngine(c.Engine, newRNG(1, 0))
	prompt := strings.Repeat(" wab", 512) // 512 tokens
	first := textSeq(1, prompt, 33)
	e.add(first)
	st := runStep(e, t0)
	if want := 5753*time.Microsecond + 512*17250*time.Nanosecond; st.duration != want {
		t.Fatalf("first prefill step %v, want %v", st.duration, want)
	}
	now := drain(t, e, t0.Add(st.duration))
	// 512 + 32 computed tokens are 34 whole blocks: 544 cached
	next := textSeq(2, prompt+completionText(33), 4)
	e.add(next)
	st = runStep(e, now)
	uncached := next.prompt - 544
	if want := 5753*time.Microsecond + time.Duration(uncached)*17250*time.Nanosecond; st.prefillTokens != uncached || st.duration != want {
		t.Fatalf("continuation: %d prefill tokens in a %v step, want %d in %v", st.prefillTokens, st.duration, uncached, want)
	}
}

// The presets' interactive waves take the same share of each pool's
// capacity as on the stress pool, within 10 %: the batch tokens they
// displace when served first (see Preset.RateScale), the scaling the
// benchmarks rely on.
func TestPresetLoadShare(t *testing.T) {
	if raceDetector {
		t.Skip("replays the 1,024-seat pool: minutes under the race detector; make test runs it without (its poolsim line)")
	}
	share := map[string]float64{}
	for _, p := range Presets() {
		for seed := range int64(3) {
			cfg := p.Config
			cfg.Seed = seed + 1
			cfg.Engine.PrefixCaching, cfg.Front.PrefixAware = true, true
			cfg.Engine.Policy, cfg.Engine.SeatPreempt, cfg.Engine.PreemptKeep = PolicyPriority, true, true
			w := Waves{Warmup: 6 * time.Second, Burst: 5 * time.Second, Idle: 5 * time.Second, Cycles: 6,
				BurstRate: 10 * p.RateScale, IdleRate: p.RateScale, Seed: uint64(seed + 1)}
			end := w.Length()
			offsets, _ := w.Schedule()
			arrivals := make([]Arrival, len(offsets))
			for i, at := range offsets {
				arrivals[i] = Arrival{At: at, Class: ClassInteractive, PromptTokens: 256, MaxTokens: 64}
			}
			limit := p.BatchConcurrency
			backlog := Backlog{Limit: func(time.Duration, Others) int { return limit }, PromptTokens: 512, MaxTokens: 256, Until: end}
			tokens := func(arr []Arrival) float64 {
				_, batch, err := ReplayBacklog(cfg, arr, backlog)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, b := range batch {
					for _, at := range b.Tokens {
						if at >= w.Warmup && at <= end {
							n++
						}
					}
				}
				return float64(n)
			}
			share[p.Name] += (1 - tokens(arrivals)/tokens(nil)) / 3
		}
		t.Logf("%s: the waves displace %.3f of the batch (mean of 3 seeds)", p.Name, share[p.Name])
	}
	for name, s := range share {
		if r := s / share[PresetStress]; r < 0.9 || r > 1.1 {
			t.Errorf("%s: the waves displace %.3f of the batch, on stress %.3f: RateScale is off by %.0f %%", name, s, share[PresetStress], 100*(r-1))
		}
	}
}
