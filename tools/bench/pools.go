package main

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/tools/internal/names"
)

// The pools interactive-protection and interactive-frontier run on: one
// per poolsim preset (stress, vllm-8b-h100-16, vllm-8b-h100). The frontier
// replays each on the virtual clock as the preset defines it. The
// real-time arms run it as this 2-core machine can keep it in time: with
// every duration of the pool, of the interactive waves and of the gate
// multiplied by the pool's dilation k (the arrival rates divided by k), and
// possibly with fewer pods and proportionally less load; every figure in
// milliseconds is divided by k again before it is printed, and every BENCH
// line says k and the pods. A run whose step lag exceeds 5 % of the pool's
// median step is no measurement (step_lag_share).

// ipPool is one preset and how the real-time arms run it.
type ipPool struct {
	preset poolsim.Preset
	// dilation is k: 1 runs the pool as the preset defines it.
	dilation float64
	// pods is the real-time arms' pod count (0: the preset's); the load
	// shrinks with it, so each pod sees the preset's load.
	pods int
}

func (p ipPool) name() string { return p.preset.Name }

// ipPools are the pools, stress first, with the dilation and pods that
// keep their step lag under 5 % of a step on this machine (measured:
// docs/benchmarks.md, "The pools").
func ipPools() []ipPool {
	var out []ipPool
	for _, pr := range poolsim.Presets() {
		p := ipPool{preset: pr, dilation: 1}
		switch pr.Name {
		case poolsim.PresetVLLM8BH100Seats16:
			p.dilation = 2
		case poolsim.PresetVLLM8BH100:
			p.dilation, p.pods = 4, 1
		}
		out = append(out, p)
	}
	return out
}

// ipSelectPools applies SLUICE_BENCH_IP_PRESETS (a comma list of preset
// names; empty: all) and SLUICE_BENCH_IP_DILATION (k for every selected
// pool but stress, which always runs at 1).
func ipSelectPools() ([]ipPool, error) {
	all := ipPools()
	want := names.Set(os.Getenv("SLUICE_BENCH_IP_PRESETS"))
	known := make([]string, len(all))
	for i, p := range all {
		known[i] = p.name()
	}
	if u := names.Unknown(want, known); len(u) > 0 {
		return nil, fmt.Errorf("SLUICE_BENCH_IP_PRESETS: unknown preset %q: want one of %s", u[0], strings.Join(known, ", "))
	}
	var out []ipPool
	for _, p := range all {
		if len(want) > 0 && !want[p.name()] {
			continue
		}
		if v := os.Getenv("SLUICE_BENCH_IP_DILATION"); v != "" && p.name() != poolsim.PresetStress {
			k, err := strconv.ParseFloat(v, 64)
			if err != nil || !(k >= 1) || k > 100 {
				return nil, fmt.Errorf("SLUICE_BENCH_IP_DILATION=%q: want a factor in [1, 100]", v)
			}
			p.dilation = k
		}
		out = append(out, p)
	}
	return out, nil
}

// k is the real-time dilation (1 on the virtual clock).
func (p ipPool) k(realTime bool) float64 {
	if !realTime || p.dilation < 1 {
		return 1
	}
	return p.dilation
}

// podShare is the real-time pods over the preset's (1 on the virtual
// clock): the load's factor.
func (p ipPool) podShare(realTime bool) float64 {
	full := p.preset.Config.Pods
	if full == 0 {
		full = poolsim.DefaultPods
	}
	if !realTime || p.pods <= 0 || p.pods >= full {
		return 1
	}
	return float64(p.pods) / float64(full)
}

// dur is d dilated for the real-time arms.
func (p ipPool) dur(d time.Duration, realTime bool) time.Duration {
	return time.Duration(float64(d) * p.k(realTime))
}

// config is the pool every arm runs on: the preset, with vLLM V1's
// automatic prefix caching in the engines and the EPP's prefix-aware
// routing in the front (what a resumed request's prefill costs depends on
// both), dilated and reduced for real time.
func (p ipPool) config(seed int64, realTime bool) poolsim.Config {
	c := p.preset.Config
	c.Seed = seed
	c.Engine.PrefixCaching, c.Front.PrefixAware = true, true
	if realTime && p.pods > 0 {
		c.Pods = p.pods
	}
	c.SetDefaults()
	if k := p.k(realTime); k != 1 {
		e := &c.Engine
		for _, d := range []*time.Duration{&e.ITL, &e.PrefillPerToken, &e.PrefillOverhead, &e.DecodePerToken, &e.RequestOverhead} {
			*d = time.Duration(float64(*d) * k)
		}
		c.Front.RefreshInterval = p.dur(c.Front.RefreshInterval, true)
		c.Front.StalenessThreshold = p.dur(c.Front.StalenessThreshold, true)
		c.Front.FlushInterval = p.dur(c.Front.FlushInterval, true)
	}
	return c
}

// seatsPerPod is the preset's max_num_seqs.
func (p ipPool) seatsPerPod() int {
	c := p.preset.Config
	c.SetDefaults()
	return c.Engine.MaxNumSeqs
}

// concurrency is the batch queue's concurrency: enough to fill the pool.
func (p ipPool) concurrency(realTime bool) int {
	return max(1, int(math.Round(float64(p.preset.BatchConcurrency)*p.podShare(realTime))))
}

// waves are the profile's interactive waves on this pool: the stress
// rates × the preset's RateScale (the same share of its capacity), with
// the given seed and cycles, dilated and reduced for real time.
func (p ipPool) waves(prof ipProfile, seed uint64, cycles int, realTime bool) poolsim.Waves {
	scale := p.preset.RateScale * p.podShare(realTime) / p.k(realTime)
	return poolsim.Waves{Warmup: p.dur(prof.warmup, realTime), Burst: p.dur(prof.phaseLen(), realTime), Idle: p.dur(prof.phaseLen(), realTime),
		Cycles: cycles, BurstRate: ipBurstRate * scale, IdleRate: ipIdleRate * scale, Seed: seed}
}

// ipModel is what the virtual clock says of a pool and a batch profile:
// the batch alone (its capacity, request rate and service time) and the
// interactive waves' share of the pool in the floor. Every arm's goodput,
// real-time or replayed, is divided by the same slack, so the two clocks
// are compared on one scale.
type ipModel struct {
	capTokS, reqPerS float64
	service          time.Duration
	seatShare        float64 // the floor's interactive seat-seconds ÷ (seats × window), mean over seeds
}

var ipModels sync.Map // key "pool/profile" → ipModel

// model computes (once per process) the pool's model for a profile from
// frontierSeeds replays.
func (p ipPool) model(prof ipProfile) (ipModel, error) {
	key := p.name() + "/" + prof.name
	if m, ok := ipModels.Load(key); ok {
		return m.(ipModel), nil
	}
	var m ipModel
	var service []float64
	for s := range int64(frontierSeeds) {
		r, err := frontierBase(p, prof, ipSeed+s)
		if err != nil {
			return ipModel{}, err
		}
		m.capTokS += r.capacity / frontierSeeds
		m.reqPerS += r.reqPerS / frontierSeeds
		m.seatShare += r.seatShare / frontierSeeds
		service = append(service, float64(r.service))
	}
	m.service = time.Duration(median(service))
	ipModels.Store(key, m)
	return m, nil
}

// slack is the batch's tokens an ideal schedule could add beside the
// interactive waves over window (see ipModel).
func (m ipModel) slack(window time.Duration) float64 {
	return m.capTokS * (1 - m.seatShare) * window.Seconds()
}

// burstSample is one arm's burst-phase TTFTs (ms), grouped by burst, so a
// bootstrap can resample whole bursts: arrivals of one burst share its
// queue and are not independent.
type burstSample [][]float64

// pooledP99Ratio is the p99 of the arm's pooled burst TTFTs over the
// floor's, with a 90 % interval from a cluster bootstrap (bursts resampled
// with replacement, arm and floor independently, n draws from seed).
func pooledP99Ratio(arm, floor burstSample, n int, seed uint64) (ratio, lo, hi float64) {
	flat := func(b burstSample) []float64 {
		var out []float64
		for _, x := range b {
			out = append(out, x...)
		}
		return out
	}
	fp := percentile(flat(floor), 0.99)
	if len(arm) == 0 || len(floor) == 0 || !(fp > 0) {
		return math.NaN(), math.NaN(), math.NaN()
	}
	ratio = percentile(flat(arm), 0.99) / fp
	rng := rand.New(rand.NewPCG(seed, 2))
	draw := func(b burstSample) []float64 {
		var out []float64
		for range b {
			out = append(out, b[rng.IntN(len(b))]...)
		}
		return out
	}
	rs := make([]float64, 0, n)
	for range n {
		a, f := draw(arm), draw(floor)
		if len(a) == 0 || len(f) == 0 {
			continue
		}
		rs = append(rs, percentile(a, 0.99)/percentile(f, 0.99))
	}
	if len(rs) == 0 {
		return ratio, math.NaN(), math.NaN()
	}
	slices.Sort(rs)
	return ratio, percentile(slices.Clone(rs), 0.05), percentile(rs, 0.95)
}

// peerPoint is one setting of a peer's knob: its goodput and p99 ratio.
type peerPoint struct {
	goodput, p99 float64
}

// p99AtGoodput interpolates a peer's p99 ratio at goodput g from its sweep:
// linearly between the two points that bracket g, or the nearest point
// when it lies within tol of g. ok is false when the sweep does not reach
// g (no point within tol beyond the bracket).
func p99AtGoodput(points []peerPoint, g, tol float64) (p99 float64, ok bool) {
	ps := slices.Clone(points)
	ps = slices.DeleteFunc(ps, func(p peerPoint) bool { return math.IsNaN(p.goodput) || math.IsNaN(p.p99) })
	if len(ps) == 0 {
		return math.NaN(), false
	}
	slices.SortFunc(ps, func(a, b peerPoint) int { return cmp.Compare(a.goodput, b.goodput) })
	for i := 1; i < len(ps); i++ {
		a, b := ps[i-1], ps[i]
		if a.goodput <= g && g <= b.goodput {
			if b.goodput == a.goodput {
				return min(a.p99, b.p99), true
			}
			t := (g - a.goodput) / (b.goodput - a.goodput)
			return a.p99 + t*(b.p99-a.p99), true
		}
	}
	best, bestD := math.NaN(), math.Inf(1)
	for _, p := range ps {
		if d := math.Abs(p.goodput - g); d <= tol && d < bestD {
			best, bestD = p.p99, d
		}
	}
	return best, !math.IsNaN(best)
}

// dominates reports whether a peer point is better than sluice's on both
// axes (more goodput and a lower p99 ratio).
func (p peerPoint) dominates(s peerPoint) bool {
	return p.goodput > s.goodput && p.p99 < s.p99
}
