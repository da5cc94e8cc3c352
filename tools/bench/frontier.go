package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/poolsim"
)

// The interactive-frontier scenario: what any dispatcher could do on the
// interactive-protection scenario's pool and waves, computed on the
// simulator's virtual clock (poolsim.ReplayBacklog), so it depends on the
// model alone and not on this machine's load. The batch is a closed loop
// kept at a limit by an ideal dispatcher: it knows the phase the instant it
// changes, keeps limit_idle batch requests in the pool in idle phases and
// limit_burst in bursts, and takes requests back (and later resumes them
// where they stopped) at no cost and with no delay. The oracle policy adds
// the engine's help: the batch fills every seat and its queue, and an
// interactive arrival takes a batch request's seat at the next step
// (priority scheduling with seat preemption, the victim keeping its
// tokens). No real dispatcher does better than these: sluice reads the
// pool's gauges every 50 ms, aborts a call (whose seat frees at the pod's
// next step) and resumes with a prefill to redo.
//
// Figures per policy (one BENCH line each, policy=<name>), with the same
// definitions as interactive-protection: ttft_p50_ratio and ttft_p99_ratio
// (burst-phase arrivals, exact percentiles, to the floor replayed on the
// same arrivals), batch_goodput_share (output tokens of the batch requests
// finished in the window ÷ the calibrated capacity × (1 − the floor's
// interactive seat share)), and ttft_idle_p99_ratio (the idle phases'
// arrivals, which the bar does not judge). The summary line gives, per
// profile, idle_p99_when_feasible (the lowest idle-phase p99 ratio of the
// policies that meet the bar: what meeting it cost between the bursts),
// best_goodput_at_p99_1_5 (the highest goodput of a policy whose p99
// ratio is ≤ 1.5) and best_p99_at_goodput_0_8 (the lowest p99 ratio of a
// policy with goodput ≥ 0.80), and feasible: 1 when one policy meets both,
// which is issue 28's bar for the recommended arm.
//
// The waves are the scenario's with frontierCycles cycles instead of
// ipCycles, so the p99 rests on about four times as many burst arrivals,
// and every policy is replayed with frontierSeeds seeds (arrivals and step
// jitter): its figures are the medians, the floor's the means.

const (
	frontierScenario = "interactive-frontier"
	frontierCycles   = 12
	frontierSeeds    = 3                  // replays per policy, each with its own arrivals and step jitter; figures are medians
	frontierBacklog  = 2 * ipPodSeats * 2 // the calibration's batch: every seat and as many waiting
)

// frontierPolicy is one ideal dispatcher.
type frontierPolicy struct {
	name string
	// limit makes the batch's limit function of one replay (it may keep
	// state, such as the last reading of a lagged policy).
	limit  func(bursts [][2]time.Duration) func(at time.Duration, others poolsim.Others) int
	oracle bool // the engine preempts a batch seat for an interactive arrival
	// recompute: a request taken back prefills again when it resumes
	recompute bool
	// youngest: the request taken back is the youngest, whatever its pod
	youngest bool
}

// frontierPolicies: the oracle; reactive dispatchers that keep reserve
// seats free beside the arrivals in the pool, knowing them at once or
// reading them every 50 ms as pool-headroom does; reactive ones that also
// choose when batch prefills run (phasereactive: a reserve per phase;
// phaseslow: in bursts the batch grows by one request per gap at most;
// detect: the same with the burst seen from the arrivals in the pool
// instead of known; nogrow: no growth while an arrival is in the pool);
// and phase-aware static limits, which show that reacting within a burst
// is what matters.
func frontierPolicies(seats int) []frontierPolicy {
	ps := []frontierPolicy{{name: "oracle", oracle: true, limit: func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func(time.Duration, poolsim.Others) int { return frontierBacklog }
	}}}
	reactive := func(reserve int, every time.Duration) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
			read, seen := time.Duration(-1), 0
			return func(at time.Duration, others poolsim.Others) int {
				if every <= 0 || read < 0 || at-read >= every {
					read, seen = at, others.In()
				}
				return max(0, seats-reserve-seen)
			}
		}
	}
	for _, r := range []int{0, 1, 2, 4, 6, 8} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("reactive-r%d", r), limit: reactive(r, 0)})
	}
	for _, r := range []int{2, 4, 8} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("reactive-r%d-read50ms", r), limit: reactive(r, 50*time.Millisecond)})
	}
	// A dispatcher that also chooses when batch prefills run: the reactive
	// limit, but the batch does not grow (no new request, no resume, so no
	// batch prefill) while an arrival is in the pool or until cool after
	// the last one left; it only shrinks then.
	noGrow := func(reserve int, cool time.Duration) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
			busy := time.Duration(-1)
			return func(at time.Duration, o poolsim.Others) int {
				want := max(0, seats-reserve-o.In())
				if o.In() > 0 {
					busy = at
				}
				if busy >= 0 && at-busy <= cool {
					want = min(want, o.Batch)
				}
				return want
			}
		}
	}
	phaseReactive := func(idle, burst int) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func(bursts [][2]time.Duration) func(time.Duration, poolsim.Others) int {
			return func(at time.Duration, o poolsim.Others) int {
				r := idle
				if poolsim.InBurst(bursts, at) {
					r = burst
				}
				return max(0, seats-r-o.In())
			}
		}
	}
	for _, rb := range []int{2, 4} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("phasereactive-i0-b%d", rb), limit: phaseReactive(0, rb)})
	}
	// in bursts, the batch grows by at most one request per gap
	phaseSlowGrow := func(idle, burst int, gap time.Duration) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func(bursts [][2]time.Duration) func(time.Duration, poolsim.Others) int {
			grew := time.Duration(-1 << 62)
			return func(at time.Duration, o poolsim.Others) int {
				if !poolsim.InBurst(bursts, at) {
					return max(0, seats-idle-o.In())
				}
				return growSlowly(&grew, at, gap, max(0, seats-burst-o.In()), o.Batch)
			}
		}
	}
	for _, rb := range []int{2, 4} {
		for _, gap := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
			ps = append(ps, frontierPolicy{name: fmt.Sprintf("phaseslow-i0-b%d-g%d", rb, gap.Milliseconds()), limit: phaseSlowGrow(0, rb, gap)})
		}
	}
	// The same, but the phase is seen, not known: a burst is when the
	// arrivals in the pool (read every `every`) reached thr within the
	// last window.
	detectSlow := func(idle, burst, thr int, window, gap, every time.Duration) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
			grew := time.Duration(-1 << 62)
			read, seen := time.Duration(-1), 0
			hot := time.Duration(-1 << 62)
			return func(at time.Duration, o poolsim.Others) int {
				if every <= 0 || read < 0 || at-read >= every {
					read, seen = at, o.In()
					if seen >= thr {
						hot = at
					}
				}
				if at-hot > window {
					return max(0, seats-idle-seen)
				}
				return growSlowly(&grew, at, gap, max(0, seats-burst-seen), o.Batch)
			}
		}
	}
	for _, thr := range []int{3, 4} {
		for _, every := range []time.Duration{0, 50 * time.Millisecond} {
			ps = append(ps, frontierPolicy{name: fmt.Sprintf("detect-i0-b2-g50-t%d-w2000-e%d", thr, every.Milliseconds()),
				limit: detectSlow(0, 2, thr, 2*time.Second, 50*time.Millisecond, every)})
		}
	}
	ps = append(ps, frontierPolicy{name: "detect-i0-b2-g50-t4-w2000-e50-recompute", limit: detectSlow(0, 2, 4, 2*time.Second, 50*time.Millisecond, 50*time.Millisecond), recompute: true})
	for _, r := range []int{2, 4} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("nogrow-r%d", r), limit: noGrow(r, 0)})
	}
	for _, r := range []int{2, 4, 8} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("reactive-r%d-read50ms-recompute", r), limit: reactive(r, 50*time.Millisecond), recompute: true})
	}
	// pool-headroom as sluice runs it, on the ideal dispatcher's costless
	// clock otherwise: a reading every 50 ms of running + weight × waiting,
	// the peak of the readings of the last hold, reserve seats kept free,
	// the youngest call taken back whatever its pod, and a prefill to redo
	// when it resumes. With a burst threshold (thr > 0) the gate's own
	// burst rule (headroom.Burst, 2-s window, one rise per 50 ms) applies,
	// and outside a burst the reserve is idle.
	headroomLike := func(reserve, idle int, weight float64, hold time.Duration, thr int) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
			type reading struct {
				at    time.Duration
				value int
			}
			var last time.Duration = -1
			var window []reading
			rule := headroom.Rule{Seats: seats, Reserve: reserve, IdleReserve: idle,
				Burst: headroom.Burst{Threshold: thr, Window: 2 * time.Second, Growth: 50 * time.Millisecond}}
			limit := 0
			return func(at time.Duration, o poolsim.Others) int {
				if last >= 0 && at-last < 50*time.Millisecond {
					return limit
				}
				last = at
				value := int(math.Ceil(float64(o.Running) + weight*float64(o.Waiting)))
				window = append(window, reading{at, value})
				for len(window) > 1 && at-window[0].at > max(hold, 0) {
					window = window[1:]
				}
				held := 0
				for _, r := range window {
					held = max(held, r.value)
				}
				_, _, limit = rule.Apply(time.Unix(0, 0).Add(at), value, held, o.Batch, -1)
				return limit
			}
		}
	}
	for _, r := range []int{2, 4} {
		for _, w := range []float64{1, 2} {
			for _, h := range []time.Duration{0, 250 * time.Millisecond, time.Second} {
				ps = append(ps, frontierPolicy{name: fmt.Sprintf("headroom-r%d-w%g-h%d", r, w, h.Milliseconds()),
					limit: headroomLike(r, r, w, h, 0), recompute: true, youngest: true})
			}
		}
	}
	// the same with the burst rule (waiting weight 2, hold 1 s): idle
	// reserve 0 or the reserve, threshold 3 or 4; "-keep": a request taken
	// back resumes with no prefill to redo (a prefix cache that kept all).
	for _, r := range []int{2, 4} {
		for _, idle := range []int{0, r} {
			for _, thr := range []int{3, 4} {
				for _, rc := range []bool{true, false} {
					name := fmt.Sprintf("headroom-burst-r%d-i%d-t%d-w2-h1000", r, idle, thr)
					if !rc {
						name += "-keep"
					}
					ps = append(ps, frontierPolicy{name: name, limit: headroomLike(r, idle, 2, time.Second, thr), recompute: rc, youngest: true})
				}
			}
		}
	}
	for _, b := range []int{16, 8} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("phase-i%d-b%d", seats, b), limit: func(bursts [][2]time.Duration) func(time.Duration, poolsim.Others) int {
			return func(at time.Duration, _ poolsim.Others) int {
				if poolsim.InBurst(bursts, at) {
					return b
				}
				return seats
			}
		}})
	}
	return ps
}

func runInteractiveFrontier(_ context.Context, _ options) (figures, error) {
	profs, err := ipSelect(ipProfiles())
	if err != nil {
		return nil, err
	}
	summary := figures{}
	for _, prof := range profs {
		f, err := frontierProfile(prof)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", prof.name, err)
		}
		for k, v := range f {
			summary[prof.name+"_"+k] = v
		}
	}
	return summary, nil
}

func frontierProfile(prof ipProfile) (figures, error) {
	per := map[string][]figures{}
	var pols []string
	out := figures{}
	for seed := range int64(frontierSeeds) {
		f, lines, err := frontierReplays(prof, ipSeed+seed)
		if err != nil {
			return nil, err
		}
		pols = pols[:0]
		for _, l := range lines {
			per[l.policy] = append(per[l.policy], l.f)
			pols = append(pols, l.policy)
		}
		for k, v := range f {
			out[k] += v / frontierSeeds
		}
	}
	bestGoodput, bestP99, bestIdle := 0.0, math.Inf(1), math.Inf(1)
	for _, name := range pols {
		f := medianFigures(per[name])
		fmt.Println(frontierLine(prof.name, name, f))
		if f["ttft_p99_ratio"] <= 1.5 {
			bestGoodput = max(bestGoodput, f["batch_goodput_share"])
		}
		if f["batch_goodput_share"] >= 0.80 {
			bestP99 = min(bestP99, f["ttft_p99_ratio"])
		}
		if f["ttft_p99_ratio"] <= 1.5 && f["batch_goodput_share"] >= 0.80 {
			bestIdle = min(bestIdle, f["ttft_idle_p99_ratio"])
		}
	}
	if math.IsInf(bestIdle, 1) {
		bestIdle = -1
	}
	out["idle_p99_when_feasible"] = bestIdle
	out["best_goodput_at_p99_1_5"] = bestGoodput
	if math.IsInf(bestP99, 1) {
		bestP99 = -1
	}
	out["best_p99_at_goodput_0_8"] = bestP99
	out["feasible"] = b2f(bestP99 >= 0 && bestP99 <= 1.5)
	return out, nil
}

// frontierResult is one policy's figures in one replay.
type frontierResult struct {
	policy string
	f      figures
}

// frontierReplays replays the floor, the batch alone and every policy with
// one seed; it returns the floor's figures (floor_ttft_p99_ms,
// capacity_tok_s) and each policy's.
func frontierReplays(prof ipProfile, seed int64) (figures, []frontierResult, error) {
	base := ipPoolConfig()
	base.Seed = seed
	seats := base.Pods * base.Engine.MaxNumSeqs
	waves := ipWaves(prof)
	waves.Cycles, waves.Seed = frontierCycles, uint64(seed)
	offsets, bursts := waves.Schedule()
	end := prof.warmup + time.Duration(frontierCycles)*2*prof.phaseLen()
	window := (end - prof.warmup).Seconds()
	arrivals := make([]poolsim.Arrival, len(offsets))
	for i, at := range offsets {
		arrivals[i] = poolsim.Arrival{At: at, Class: poolsim.ClassInteractive, PromptTokens: ipInteractivePT, MaxTokens: ipInteractiveOut}
	}
	backlog := func(limit func(time.Duration, poolsim.Others) int) poolsim.Backlog {
		return poolsim.Backlog{Limit: limit, PromptTokens: prof.batchPrompt, MaxTokens: prof.batchOutput, Until: end}
	}

	floor, _, err := poolsim.ReplayBacklog(base, arrivals, poolsim.Backlog{})
	if err != nil {
		return nil, nil, err
	}
	floorTTFT := frontierTTFTs(arrivals, floor, bursts, prof.warmup, true)
	floorP50, floorP99 := percentile(slices.Clone(floorTTFT), 0.50), percentile(slices.Clone(floorTTFT), 0.99)
	floorIdleP99 := percentile(frontierTTFTs(arrivals, floor, bursts, prof.warmup, false), 0.99)
	seatS := 0.0
	for _, tr := range floor {
		if n := len(tr.Tokens); n > 0 && tr.FirstScheduled >= prof.warmup && tr.Tokens[n-1] <= end {
			seatS += (tr.Tokens[n-1] - tr.FirstScheduled).Seconds()
		}
	}
	seatShare := seatS / (float64(seats) * window)

	_, alone, err := poolsim.ReplayBacklog(base, nil, backlog(func(time.Duration, poolsim.Others) int { return frontierBacklog }))
	if err != nil {
		return nil, nil, err
	}
	capacity := frontierTokens(alone, prof.warmup, end) / window
	slack := capacity * (1 - seatShare) * window
	fmt.Fprintf(os.Stderr, "bench: %s %s seed %d: floor ttft p50 %.1f ms p99 %.1f ms over %d burst arrivals; batch capacity %.0f tok/s; interactive seat share %.3f\n",
		frontierScenario, prof.name, seed, floorP50, floorP99, len(floorTTFT), capacity, seatShare)

	out := figures{"floor_ttft_p99_ms": floorP99, "capacity_tok_s": capacity}
	var res []frontierResult
	for _, pol := range frontierPolicies(seats) {
		cfg := base
		if pol.oracle {
			cfg.Engine.Policy, cfg.Engine.SeatPreempt, cfg.Engine.PreemptKeep = poolsim.PolicyPriority, true, true
		}
		limit := pol.limit(bursts)
		bl := backlog(limit)
		bl.Recompute, bl.ParkYoungest = pol.recompute, pol.youngest
		traces, batch, err := poolsim.ReplayBacklog(cfg, arrivals, bl)
		if err != nil {
			return nil, nil, fmt.Errorf("policy %s: %w", pol.name, err)
		}
		ttft := frontierTTFTs(arrivals, traces, bursts, prof.warmup, true)
		res = append(res, frontierResult{pol.name, figures{
			"ttft_p50_ratio": percentile(slices.Clone(ttft), 0.50) / floorP50,
			"ttft_p99_ratio": percentile(slices.Clone(ttft), 0.99) / floorP99,
			// the idle phases' arrivals, which the bar does not judge
			"ttft_idle_p99_ratio": percentile(frontierTTFTs(arrivals, traces, bursts, prof.warmup, false), 0.99) / floorIdleP99,
			"batch_goodput_share": frontierTokens(batch, prof.warmup, end) / slack,
		}})
	}
	return out, res, nil
}

// frontierTTFTs are the TTFTs (ms) of the arrivals after the warm-up in
// burst phases (inBurst) or in idle phases.
func frontierTTFTs(arrivals []poolsim.Arrival, traces []poolsim.Trace, bursts [][2]time.Duration, warmup time.Duration, inBurst bool) []float64 {
	var out []float64
	for i, a := range arrivals {
		if a.At >= warmup && poolsim.InBurst(bursts, a.At) == inBurst && len(traces[i].Tokens) > 0 {
			out = append(out, float64(traces[i].TTFT(a))/float64(time.Millisecond))
		}
	}
	return out
}

// frontierTokens are the output tokens of the batch requests that finished
// in [from, to], as interactive-protection counts its ok results.
func frontierTokens(batch []poolsim.BatchTrace, from, to time.Duration) float64 {
	n := 0
	for _, b := range batch {
		if k := len(b.Tokens); b.Done && b.Tokens[k-1] >= from && b.Tokens[k-1] <= to {
			n += k
		}
	}
	return float64(n)
}

func frontierLine(profile, policy string, f figures) string {
	line := format(frontierScenario, f)
	return "BENCH " + frontierScenario + " profile=" + profile + " policy=" + policy + line[len("BENCH "+frontierScenario):]
}

// frontierTargets: the frontier is reported, not held to a bar; it says
// whether interactive-protection's bar is reachable on the model at all.
func frontierTargets() []target {
	var ts []target
	for _, prof := range ipProfiles() {
		k := prof.name + "_"
		ts = append(ts,
			reportedOnly(k+"feasible", "1 when an ideal dispatcher meets issue 28's bar (p99 ≤ 1.5× with goodput ≥ 0.80) on the pool model"),
			reportedOnly(k+"best_goodput_at_p99_1_5", "the best goodput of an ideal dispatcher that keeps p99 ≤ 1.5×"),
			reportedOnly(k+"best_p99_at_goodput_0_8", "the best p99 ratio of an ideal dispatcher with goodput ≥ 0.80 (-1: none)"),
			reportedOnly(k+"idle_p99_when_feasible", "the lowest idle-phase p99 ratio of the ideal dispatchers that meet the bar, which judges burst phases only (-1: none meets it)"),
		)
	}
	return ts
}

// growSlowly is a burst phase's limit: want, but while want is above the
// batch requests running, one more than those at most once every gap (grew
// is when it last allowed one more).
func growSlowly(grew *time.Duration, at, gap time.Duration, want, running int) int {
	if want <= running {
		return want
	}
	if at-*grew < gap {
		return running
	}
	*grew = at
	return running + 1
}
