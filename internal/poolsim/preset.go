package poolsim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Preset names (PresetByName).
const (
	// PresetStress is the default pool: the constants of the design notes'
	// section 5.4 (2 pods × 16 seats, a load factor of 2, 50 µs a prompt
	// token, 10 ms a starting prefill, 12,288 KV tokens a pod). It is
	// harsher than a vLLM pod: its steps cost 2–25× too much and its KV is
	// ~38× too small (docs/simulate-pool.md, "Calibration").
	PresetStress = "stress"
	// PresetVLLM8BH100 is Llama-3.1-8B on one H100 per pod at vLLM's
	// defaults for that GPU: BLIS's step model and KV capacity, 1,024 seats,
	// 8,192 tokens a step, chunked prefill, prefix caching.
	PresetVLLM8BH100 = "vllm-8b-h100"
	// PresetVLLM8BH100Seats16 is PresetVLLM8BH100 with max_num_seqs 16, as
	// operators who cap seats to bound latency run it.
	PresetVLLM8BH100Seats16 = "vllm-8b-h100-16"
)

// The measured model behind the vLLM presets: BLIS (inference-sim) fitted
// its "blackbox" step model β0 + β1·uncached prefill tokens + β2·decode
// tokens (sim/latency/latency.go) to measured vLLM steps; these are its fit
// for Llama-3.1-8B-Instruct on one H100 (its golden dataset,
// testdata/goldendataset.json before commit f680ac8b), with the KV capacity
// of defaults.yaml's entry for the model on one H100 (29,205 blocks of 16
// tokens) and the fit's per-request overhead outside the step (α0).
// docs/simulate-pool.md "Against BLIS" replays BLIS's own runs here.
const (
	vllmStepConstant   = 5753 * time.Microsecond
	vllmPrefillToken   = 17250 * time.Nanosecond
	vllmDecodeToken    = 6 * time.Microsecond
	vllmKVBlocks       = 29205
	vllmRequestCPU     = 230 * time.Microsecond
	vllmMaxNumSeqs     = 1024 // vLLM's default for an H100-class GPU (≥ 70 GiB, not A100)
	vllmMaxBatchTokens = 8192 // the same default's token budget a step
)

// Preset is a named pool: its configuration, and the load that takes the
// same share of it as the benchmarks' interactive waves take of the stress
// pool.
type Preset struct {
	// Name is what --preset takes.
	Name string
	// Doc says what the pool is, in one line.
	Doc string
	// Config is the pool (zero fields take their defaults).
	Config Config
	// RateScale multiplies the stress pool's interactive arrival rates so
	// that interactive traffic takes the same share of this pool's
	// capacity (~16 %); BatchConcurrency is how many batch requests a
	// dispatcher keeps in flight to fill the rest (its queue concurrency).
	RateScale        float64
	BatchConcurrency int
}

// Presets returns every preset, stress first.
func Presets() []Preset {
	vllm := func(seats int) Config {
		c := Config{}
		e := &c.Engine
		e.StepModel = StepModelLinear
		e.ITL, e.PrefillPerToken, e.DecodePerToken = vllmStepConstant, vllmPrefillToken, vllmDecodeToken
		e.RequestOverhead = vllmRequestCPU
		e.MaxNumSeqs, e.MaxNumBatchedTokens = seats, vllmMaxBatchTokens
		e.BlockSize, e.KVBlocks = 16, vllmKVBlocks
		e.PrefixCaching = true
		e.MaxModelLen = 8192
		return c
	}
	return []Preset{
		{Name: PresetStress, Doc: "2 pods x 16 seats, load factor 2, 50us a prompt token, 10ms a prefill start, 12,288 KV tokens: harsher than a vLLM pod (the default)",
			RateScale: 1, BatchConcurrency: 64},
		{Name: PresetVLLM8BH100, Doc: "2 pods of Llama-3.1-8B on one H100 at vLLM's defaults: BLIS's step model, 1,024 seats, 8,192 tokens a step, 29,205 KV blocks, prefix caching",
			Config: vllm(vllmMaxNumSeqs), RateScale: presetScaleH100, BatchConcurrency: presetBatchH100},
		{Name: PresetVLLM8BH100Seats16, Doc: "vllm-8b-h100 with max_num_seqs 16 (seats capped to bound latency)",
			Config: vllm(16), RateScale: presetScaleH100Seats16, BatchConcurrency: 64},
	}
}

// PresetNames lists the presets' names, stress first.
func PresetNames() []string {
	var out []string
	for _, p := range Presets() {
		out = append(out, p.Name)
	}
	return out
}

// PresetByName returns the named preset; an unknown name is an error that
// lists the presets.
func PresetByName(name string) (Preset, error) {
	ps := Presets()
	if i := slices.IndexFunc(ps, func(p Preset) bool { return p.Name == name }); i >= 0 {
		return ps[i], nil
	}
	return Preset{}, fmt.Errorf("unknown pool preset %q: want one of %s", name, strings.Join(PresetNames(), ", "))
}

// The vLLM presets' load (TestPresetLoadShare checks it). The share of a
// pool's capacity that interactive traffic takes is measured as what it
// displaces when it is served first: the batch tokens a full backlog loses
// beside the waves on an engine that gives every arrival a seat at once
// (priority with seat preemption, the victim keeping its tokens). The
// stress pool's waves (bursts of 10 requests/s, 1 between them) displace
// 0.29 of its batch (3 seeds of 6 cycles; their seat share is 0.16); the
// same waves scaled by RateScale displace the same share of the vLLM
// presets' (measured: 0.25 at ×18 and 0.31 at ×21 on the 1,024-seat pool,
// 0.28 at ×3.7 and 0.31 at ×4 on the 16-seat one).
// The batch concurrency fills the pool: every seat twice (the 16-seat
// preset) or, with 1,024 seats, more than its KV cache holds (~600
// requests of 768 tokens a pod).
const (
	presetScaleH100        = 20
	presetBatchH100        = 2048
	presetScaleH100Seats16 = 3.8
)
