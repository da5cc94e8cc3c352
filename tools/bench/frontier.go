package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
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
// where they stopped) at no cost and with no delay. The engine-max-goodput
// policy (once "oracle") adds the engine's help: the batch fills every seat and its queue, and an
// interactive arrival takes a batch request's seat at the next step
// (priority scheduling with seat preemption, the victim keeping its
// tokens); it is the engine's max-goodput point, not a bound. Sluice reads
// the pool's gauges every 50 ms, aborts a call (whose seat frees at the
// pod's next step) and resumes it.
//
// Figures per policy (one BENCH line each, policy=<name>), with the same
// definitions as interactive-protection: ttft_p50_ratio and ttft_p99_ratio
// (burst-phase arrivals, exact percentiles, to the floor replayed on the
// same arrivals), batch_goodput_share (output tokens of the batch requests
// finished in the window ÷ the batch's capacity alone × (1 − the floor's
// interactive seat share)), ttft_idle_p99_ratio (the idle phases'
// arrivals, which the bar does not judge), the spread over seeds (_p10,
// _p90) and blind (1: the policy does not know the phase schedule). The
// summary line gives, per pool and profile, G*(x) =
// best_goodput_at_p99_1_3 and _1_5 (the highest median goodput of a blind
// policy whose median p99 ratio is ≤ x), best_p99_at_goodput_0_8 and
// _0_85, and engine_max_goodput.
//
// The waves are the pool's (ipPool.waves) with frontierCycles cycles
// instead of ipCycles, so the p99 rests on about four times as many burst
// arrivals, and every policy is replayed with frontierSeeds seeds
// (arrivals and ±frontierJitter step jitter): its figures are the medians.

const (
	frontierScenario = "interactive-frontier"
	frontierCycles   = 12
	frontierSeeds    = 12 // replays per policy, each with its own arrivals and step jitter; figures are medians
	// frontierJitter is every pool's step jitter (±5 %), on both clocks:
	// the seeds draw it, so a policy's spread over seeds includes it.
	frontierJitter = 0.05
	// frontierEngine is the max-goodput engine point (formerly "oracle"):
	// the batch fills every seat and its queue and the engine preempts a
	// batch seat for each interactive arrival, the victim keeping its
	// tokens. It is the most goodput the engine can give beside the
	// arrivals, not a bound on p99 or on what a dispatcher can reach.
	frontierEngine = "engine-max-goodput"
	// frontierTwin is sluice's recommended rule replayed: the real-time
	// recommended arm's twin on the virtual clock (one clock). Its resumed
	// requests redo no prefill ("-keep"): the real-time pools run vLLM's
	// prefix cache and the EPP's prefix-aware routing, so a resumed call
	// finds the blocks its aborted call left (prefix_hit_tokens). The
	// recomputing twin (without "-keep") was the larger part of the 0.09
	// of goodput between the clocks that issue 41 measured.
	frontierTwin = "headroom-burst-r4-i4-t3-w2-h1000-keep"
)

// frontierPodTwinFor is the per-pod arm's twin on a pool (ipPodArm,
// ipPodSettings): pool-headroom with dispatch "pods", its rules per pod, a
// request taken back waiting for its pod and resuming there from the
// prefix cache.
func frontierPodTwinFor(preset string) string {
	switch preset {
	case "vllm-8b-h100-16":
		return "pods-r0-i0-t3-w1-h250-p1-stay-e10"
	case "vllm-8b-h100":
		return "pods-r2-i2-t3-w1-h250-p4-stay-k25600"
	}
	return "pods-r2-i2-t3-w1-h250-p1-stay"
}

// frontierPolicy is one ideal dispatcher.
type frontierPolicy struct {
	name string
	// limit makes the batch's limit function of one replay (it may keep
	// state, such as the last reading of a lagged policy).
	limit func(bursts [][2]time.Duration) func(at time.Duration, others poolsim.Others) int
	// engine: the engine preempts a batch seat for an interactive arrival
	engine bool
	// recompute: a request taken back prefills again when it resumes
	recompute bool
	// youngest: the request taken back is the youngest, whatever its pod
	youngest bool
	// blind: the policy does not know the phase schedule (it sees only
	// the pool); G*(x) is the best goodput of the blind ones.
	blind bool
	// podLimit, instead of limit, places the batch on the pods itself
	// (pool-headroom's dispatch "pods"): each pod's limit, read every
	// 50 ms, at most pending placements per pod between readings.
	// The second function, when not nil, is each pod's pace in tokens
	// at a time (a slower one in the pod's burst).
	podLimit func() (func(at time.Duration, pod int, others poolsim.Others) int, func(at time.Duration, pod int) float64)
	pending  int
	stay     bool
	read     time.Duration // the per-pod policy's reading period (0: 50 ms)
	pace     float64       // the per-pod policy's pace in prefill tokens per second per pod (0: none)
}

// frontierPolicies: the max-goodput engine point; reactive dispatchers
// that keep reserve seats free beside the arrivals in the pool, knowing
// them at once or reading them every 50 ms as pool-headroom does; reactive
// ones that also choose when batch prefills run (phasereactive: a reserve
// per phase; phaseslow: in bursts the batch grows by one request per gap at
// most; detect: the same with the burst seen from the arrivals in the pool
// instead of known; nogrow: no growth while an arrival is in the pool);
// static caps on the batch in the pool (on pods with many seats the batch
// hurts through the steps, not the seats); and phase-aware static limits,
// which show that reacting within a burst is what matters. Only the
// policies marked blind may set G*(x): the others know the schedule.
func frontierPolicies(pool ipPool) []frontierPolicy {
	perPod := pool.seatsPerPod()
	pods := pool.preset.Config.Pods
	if pods == 0 {
		pods = poolsim.DefaultPods
	}
	seats := pods * perPod
	backlog := pool.preset.BatchConcurrency
	ps := []frontierPolicy{{name: frontierEngine, engine: true, blind: true, limit: func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func(time.Duration, poolsim.Others) int { return backlog }
	}}}
	for _, frac := range []int{1, 2, 4, 8, 16, 32} {
		if l := backlog / frac; frac == 1 || l >= 2 {
			ps = append(ps, frontierPolicy{name: fmt.Sprintf("static-%d", l), blind: true, limit: func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
				return func(time.Duration, poolsim.Others) int { return l }
			}})
		}
	}
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
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("reactive-r%d", r), limit: reactive(r, 0), blind: true})
	}
	for _, r := range []int{2, 4, 8} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("reactive-r%d-read50ms", r), limit: reactive(r, 50*time.Millisecond), blind: true})
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
				limit: detectSlow(0, 2, thr, 2*time.Second, 50*time.Millisecond, every), blind: true})
		}
	}
	// inBurst sees a burst as detectCap and freezeCap do: the arrivals in
	// the pool, read every 50 ms, reached thr within the last 2 s.
	inBurst := func(thr int) func(at time.Duration, o poolsim.Others) bool {
		read := time.Duration(-1)
		hot := time.Duration(-1 << 62)
		return func(at time.Duration, o poolsim.Others) bool {
			if read < 0 || at-read >= 50*time.Millisecond {
				read = at
				if o.In() >= thr {
					hot = at
				}
			}
			return at-hot <= 2*time.Second
		}
	}
	// Caps instead of seat reserves, for pods whose seats are never the
	// limit: the batch holds at most idle requests, and while a burst is
	// seen (others ≥ thr within the last window, read every 50 ms) at most
	// burst, the ones over it taken back (youngest first) at no cost: what
	// a dispatcher that paces the batch's prefill work by the steps could
	// reach, blind to the schedule.
	detectCap := func(idle, burst, thr int) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
			seen := inBurst(thr)
			return func(at time.Duration, o poolsim.Others) int {
				if !seen(at, o) {
					return idle
				}
				return min(burst, idle)
			}
		}
	}
	// Step-aware, for pods whose seats are never the limit (issue 42 item
	// 4): the batch prefills only between bursts. It holds at most cap
	// requests (so its decode tokens and KV stay bounded), and while a
	// burst is seen (as detectCap sees one) it neither grows (no batch
	// prefill shares a step with the arrivals' prefills) nor shrinks (a
	// take-back would restart a prefill later): it drains as its requests
	// finish.
	freezeCap := func(limit, thr int) func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
		return func([][2]time.Duration) func(time.Duration, poolsim.Others) int {
			seen := inBurst(thr)
			return func(at time.Duration, o poolsim.Others) int {
				if !seen(at, o) {
					return limit
				}
				return min(limit, o.Batch)
			}
		}
	}
	if perPod > 64 {
		for _, c := range []int{backlog / 8, backlog / 4, 3 * backlog / 8, backlog / 2} {
			for _, thr := range []int{40, 80} {
				ps = append(ps, frontierPolicy{name: fmt.Sprintf("freezecap-c%d-t%d", c, thr), limit: freezeCap(c, thr), blind: true})
			}
		}
	}
	if perPod > 64 {
		// the interactive requests in the pool on vllm-8b-h100: about 10-15
		// between bursts and 100-140 in one
		for _, idle := range []int{backlog / 4, backlog / 2} {
			for _, burst := range []int{backlog / 64, backlog / 32, backlog / 16} {
				for _, thr := range []int{40, 80} {
					ps = append(ps, frontierPolicy{name: fmt.Sprintf("detectcap-i%d-b%d-t%d", idle, burst, thr), limit: detectCap(idle, burst, thr), blind: true})
				}
			}
		}
	}
	ps = append(ps, frontierPolicy{name: "detect-i0-b2-g50-t4-w2000-e50-recompute", limit: detectSlow(0, 2, 4, 2*time.Second, 50*time.Millisecond, 50*time.Millisecond), recompute: true, blind: true})
	for _, r := range []int{2, 4} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("nogrow-r%d", r), limit: noGrow(r, 0), blind: true})
	}
	for _, r := range []int{2, 4, 8} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("reactive-r%d-read50ms-recompute", r), limit: reactive(r, 50*time.Millisecond), recompute: true, blind: true})
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
					limit: headroomLike(r, r, w, h, 0), recompute: true, youngest: true, blind: true})
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
					ps = append(ps, frontierPolicy{name: name, limit: headroomLike(r, idle, 2, time.Second, thr), recompute: rc, youngest: true, blind: true})
				}
			}
		}
	}
	ps = append(ps, podPolicies(perPod, pods)...)
	for _, b := range []int{seats / 2, seats / 4} {
		ps = append(ps, frontierPolicy{name: fmt.Sprintf("phase-i%d-b%d", seats, b), limit: func(bursts [][2]time.Duration) func(time.Duration, poolsim.Others) int {
			return func(at time.Duration, _ poolsim.Others) int {
				if poolsim.InBurst(bursts, at) {
					return b
				}
				return seats
			}
		}})
	}
	if perPod > 64 {
		// Pods with many seats: a reserve of a few seats changes nothing
		// there (the batch hurts through the steps), so the seat-reserve
		// variants collapse onto the uncapped batch; keep one of each
		// family, the twin, and the caps, which are what differ.
		keep := map[string]bool{frontierEngine: true, "reactive-r0": true, "reactive-r4-read50ms": true, "nogrow-r2": true,
			"detect-i0-b2-g50-t4-w2000-e50": true, "headroom-r4-w2-h1000": true, "headroom-burst-r4-i4-t3-w2-h1000": true, frontierTwin: true, "phasereactive-i0-b4": true}
		ps = slices.DeleteFunc(ps, func(p frontierPolicy) bool {
			return !keep[p.name] && !strings.HasPrefix(p.name, "static-") && !strings.HasPrefix(p.name, "phase-") && !strings.HasPrefix(p.name, "detectcap-") &&
				!strings.HasPrefix(p.name, "freezecap-") && !strings.HasPrefix(p.name, "pods-r2-i2-t3-w1-h250-p") && !(strings.HasPrefix(p.name, "pods-") && strings.Contains(p.name, "-k"))
		})
	}
	if v := os.Getenv("SLUICE_BENCH_IP_POLICIES"); v != "" {
		// a probe of a few policies: those named by a prefix, the engine
		// point and both twins (G*(x) is then of those only)
		want := strings.Split(v, ",")
		ps = slices.DeleteFunc(ps, func(p frontierPolicy) bool {
			if p.name == frontierEngine || p.name == frontierTwin || p.name == frontierPodTwinFor(pool.name()) {
				return false
			}
			return !slices.ContainsFunc(want, func(w string) bool { return w != "" && strings.HasPrefix(p.name, w) })
		})
	}
	return ps
}

func runInteractiveFrontier(_ context.Context, _ options) (figures, error) {
	pools, err := ipSelectPools()
	if err != nil {
		return nil, err
	}
	profs, err := ipSelect(ipProfiles())
	if err != nil {
		return nil, err
	}
	summary := figures{}
	for _, pool := range pools {
		for _, prof := range profs {
			f, err := frontierFor(pool, prof)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", pool.name(), prof.name, err)
			}
			for _, l := range f.lines {
				fmt.Println(l)
			}
			for k, v := range f.summary {
				summary[pool.name()+"_"+prof.name+"_"+k] = v
			}
		}
	}
	summary["seeds"] = frontierSeeds
	return summary, nil
}

// frontierGoodputAt is G*(x): the best median goodput of a blind policy
// whose median p99 ratio is ≤ x (0 when none).
func (f *frontierRun) goodputAt(x float64) float64 {
	best := 0.0
	for _, name := range f.policies {
		m := f.median[name]
		if f.blind[name] && m["ttft_p99_ratio"] <= x {
			best = max(best, m["batch_goodput_share"])
		}
	}
	return best
}

// p99At is the best median p99 ratio of a blind policy with median goodput
// ≥ g (-1 when none).
func (f *frontierRun) p99At(g float64) float64 {
	best := math.Inf(1)
	for _, name := range f.policies {
		m := f.median[name]
		if f.blind[name] && m["batch_goodput_share"] >= g {
			best = min(best, m["ttft_p99_ratio"])
		}
	}
	if math.IsInf(best, 1) {
		return -1
	}
	return best
}

// frontierRun is the frontier of one pool and profile.
type frontierRun struct {
	policies []string
	median   map[string]figures
	blind    map[string]bool
	lines    []string
	summary  figures
}

var frontierRuns sync.Map // "pool/profile" → *frontierRun

// frontierFor replays every policy on frontierSeeds seeds (side by side on
// the machine's cores), once per process: interactive-protection reads
// G*(x) and its arm's replayed twin from the same run.
func frontierFor(pool ipPool, prof ipProfile) (*frontierRun, error) {
	key := pool.name() + "/" + prof.name
	if r, ok := frontierRuns.Load(key); ok {
		return r.(*frontierRun), nil
	}
	type seedRun struct {
		base  frontierBaseRun
		lines []frontierResult
		err   error
	}
	runs := make([]seedRun, frontierSeeds)
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	var wg sync.WaitGroup
	for i := range runs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			runs[i].base, runs[i].lines, runs[i].err = frontierReplays(pool, prof, ipSeed+int64(i))
		}()
	}
	wg.Wait()
	per := map[string][]figures{}
	run := &frontierRun{median: map[string]figures{}, blind: map[string]bool{}, summary: figures{}}
	for _, p := range frontierPolicies(pool) {
		run.policies = append(run.policies, p.name)
		run.blind[p.name] = p.blind
	}
	var floorP99, capy []float64
	for _, r := range runs {
		if r.err != nil {
			return nil, r.err
		}
		floorP99 = append(floorP99, r.base.floorP99)
		capy = append(capy, r.base.capacity)
		for _, l := range r.lines {
			per[l.policy] = append(per[l.policy], l.f)
		}
	}
	run.summary["floor_ttft_p99_ms"] = median(floorP99)
	run.summary["capacity_tok_s"] = median(capy)
	for _, name := range run.policies {
		fs := per[name]
		m := medianFigures(fs)
		// the spread over seeds: the 10th and 90th percentiles
		for _, k := range []string{"ttft_p99_ratio", "batch_goodput_share"} {
			var xs []float64
			for _, f := range fs {
				xs = append(xs, f[k])
			}
			m[k+"_p10"] = percentile(slices.Clone(xs), 0.10)
			m[k+"_p90"] = percentile(xs, 0.90)
		}
		m["blind"] = b2f(run.blind[name])
		run.median[name] = m
		run.lines = append(run.lines, frontierLine(pool, prof.name, name, m))
	}
	run.summary["best_goodput_at_p99_1_3"] = run.goodputAt(1.3)
	run.summary["best_goodput_at_p99_1_5"] = run.goodputAt(1.5)
	run.summary["best_p99_at_goodput_0_8"] = run.p99At(0.80)
	run.summary["best_p99_at_goodput_0_85"] = run.p99At(0.85)
	run.summary["engine_max_goodput"] = run.median[frontierEngine]["batch_goodput_share"]
	frontierRuns.Store(key, run)
	return run, nil
}

// frontierResult is one policy's figures in one replay.
type frontierResult struct {
	policy string
	f      figures
}

// frontierBaseRun is what every policy of one seed is measured against:
// the floor (the waves alone) and the batch alone.
type frontierBaseRun struct {
	cfg              poolsim.Config
	arrivals         []poolsim.Arrival
	bursts           [][2]time.Duration
	end, warmup      time.Duration
	phase            time.Duration // a burst's length
	floorTTFT        []float64
	floorP50         float64
	floorP99         float64
	floorIdleP99     float64
	capacity         float64       // batch tokens/s, alone
	reqPerS          float64       // batch requests finished per second, alone
	service          time.Duration // median first token → last token of a batch request, alone
	seatShare, slack float64
}

// frontierBase replays the floor and the batch alone for one seed.
func frontierBase(pool ipPool, prof ipProfile, seed int64) (frontierBaseRun, error) {
	base := pool.config(seed, false)
	base.Engine.StepJitter = frontierJitter
	seats := base.Pods * base.Engine.MaxNumSeqs
	waves := pool.waves(prof, uint64(seed), frontierCycles, false)
	offsets, bursts := waves.Schedule()
	end := waves.Length()
	window := (end - waves.Warmup).Seconds()
	arrivals := make([]poolsim.Arrival, len(offsets))
	for i, at := range offsets {
		arrivals[i] = poolsim.Arrival{At: at, Class: poolsim.ClassInteractive, PromptTokens: ipInteractivePT, MaxTokens: ipInteractiveOut}
	}
	r := frontierBaseRun{cfg: base, arrivals: arrivals, bursts: bursts, end: end, warmup: waves.Warmup, phase: waves.Burst}
	floor, _, err := poolsim.ReplayBacklog(base, arrivals, poolsim.Backlog{})
	if err != nil {
		return r, err
	}
	r.floorTTFT = frontierTTFTs(arrivals, floor, bursts, waves.Warmup, true)
	r.floorP50, r.floorP99 = percentile(slices.Clone(r.floorTTFT), 0.50), percentile(slices.Clone(r.floorTTFT), 0.99)
	r.floorIdleP99 = percentile(frontierTTFTs(arrivals, floor, bursts, waves.Warmup, false), 0.99)
	seatS := 0.0
	for _, tr := range floor {
		if n := len(tr.Tokens); n > 0 && tr.FirstScheduled >= waves.Warmup && tr.Tokens[n-1] <= end {
			seatS += (tr.Tokens[n-1] - tr.FirstScheduled).Seconds()
		}
	}
	r.seatShare = seatS / (float64(seats) * window)
	backlog := pool.preset.BatchConcurrency
	_, alone, err := poolsim.ReplayBacklog(base, nil, poolsim.Backlog{Limit: func(time.Duration, poolsim.Others) int { return backlog },
		PromptTokens: prof.batchPrompt, MaxTokens: prof.batchOutput, Until: end})
	if err != nil {
		return r, err
	}
	r.capacity = frontierTokens(alone, waves.Warmup, end) / window
	var service []float64
	n := 0
	for _, b := range alone {
		if k := len(b.Tokens); b.Done && b.Tokens[k-1] >= waves.Warmup && b.Tokens[k-1] <= end {
			n++
			// from its first token to its last: the time it held a seat,
			// less its prefill (a step), not its wait in the queue
			service = append(service, float64(b.Tokens[k-1]-b.Tokens[0]))
		}
	}
	r.reqPerS = float64(n) / window
	r.service = time.Duration(median(service))
	r.slack = r.capacity * (1 - r.seatShare) * window
	return r, nil
}

// frontierReplays replays the floor, the batch alone and every policy with
// one seed.
func frontierReplays(pool ipPool, prof ipProfile, seed int64) (frontierBaseRun, []frontierResult, error) {
	b, err := frontierBase(pool, prof, seed)
	if err != nil {
		return b, nil, err
	}
	fmt.Fprintf(os.Stderr, "bench: %s %s %s seed %d: floor ttft p50 %.1f ms p99 %.1f ms over %d burst arrivals; batch capacity %.0f tok/s; interactive seat share %.3f\n",
		frontierScenario, pool.name(), prof.name, seed, b.floorP50, b.floorP99, len(b.floorTTFT), b.capacity, b.seatShare)
	var res []frontierResult
	for _, pol := range frontierPolicies(pool) {
		cfg := b.cfg
		if pol.engine {
			cfg.Engine.Policy, cfg.Engine.SeatPreempt, cfg.Engine.PreemptKeep = poolsim.PolicyPriority, true, true
		}
		bl := poolsim.Backlog{PromptTokens: prof.batchPrompt, MaxTokens: prof.batchOutput, Until: b.end,
			Recompute: pol.recompute, ParkYoungest: pol.youngest}
		if pol.podLimit != nil {
			bl.PodLimit, bl.PodPace = pol.podLimit()
			bl.ReadEvery, bl.PendingPrefills, bl.Stay, bl.PaceTokens = headroom.DefaultRefreshInterval, pol.pending, pol.stay, pol.pace
			if pol.read > 0 {
				bl.ReadEvery = pol.read
			}
		} else {
			bl.Limit = pol.limit(b.bursts)
		}
		traces, batch, err := poolsim.ReplayBacklog(cfg, b.arrivals, bl)
		if err != nil {
			return b, nil, fmt.Errorf("policy %s: %w", pol.name, err)
		}
		ttft := frontierTTFTs(b.arrivals, traces, b.bursts, b.warmup, true)
		res = append(res, frontierResult{pol.name, figures{
			"ttft_p50_ratio": percentile(slices.Clone(ttft), 0.50) / b.floorP50,
			"ttft_p99_ratio": percentile(slices.Clone(ttft), 0.99) / b.floorP99,
			// the idle phases' arrivals, which the bar does not judge
			"ttft_idle_p99_ratio": percentile(frontierTTFTs(b.arrivals, traces, b.bursts, b.warmup, false), 0.99) / b.floorIdleP99,
			"batch_goodput_share": frontierTokens(batch, b.warmup, b.end) / b.slack,
			// as interactive-protection measures it, on the virtual clock
			"gate_reaction_ms": median(frontierReaction(fmt.Sprintf("frontier_%s_%s_%s_seed%d", pool.name(), prof.name, pol.name, seed), batch, b.bursts, b.warmup, b.end, b.phase)),
		}})
	}
	return b, res, nil
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

// frontierReaction is, per burst after the warm-up, how long the batch's
// occupancy of the pool took to fall after the burst began
// (ipReaction), from the replayed placements, parks and completions
// sampled every 10 ms; named, the samples are dumped as
// interactive-protection's are (SLUICE_BENCH_IP_SAMPLES).
func frontierReaction(name string, batch []poolsim.BatchTrace, bursts [][2]time.Duration, warmup, end, phase time.Duration) []float64 {
	const every = 10 * time.Millisecond
	delta := make([]float64, end/every+2)
	bump := func(at time.Duration, d float64) {
		if i := int(at/every) + 1; i < len(delta) {
			delta[i] += d
		}
	}
	for _, b := range batch {
		for _, at := range b.Placed {
			bump(at, 1)
		}
		for _, at := range b.Left {
			bump(at, -1)
		}
		if k := len(b.Tokens); b.Done && k > 0 {
			bump(b.Tokens[k-1], -1)
		}
	}
	samples := make([]ipSample, len(delta))
	level := 0.0
	for i, d := range delta {
		level += d
		samples[i] = ipSample{at: time.Duration(i) * every, limit: level}
	}
	var after [][2]time.Duration
	for _, b := range bursts {
		if b[0] >= warmup {
			after = append(after, b)
		}
	}
	reaction, _ := ipReaction(samples, after, phase)
	ipDumpSamples(name, samples, after, reaction)
	return reaction
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

func frontierLine(pool ipPool, profile, policy string, f figures) string {
	line := format(frontierScenario, f)
	return fmt.Sprintf("BENCH %s preset=%s seeds=%d profile=%s policy=%s%s", frontierScenario, pool.name(), frontierSeeds, profile, policy,
		line[len("BENCH "+frontierScenario):])
}

// frontierTargets: the frontier is reported, not held to a bar; it sets
// the bar interactive-protection's recommended arm is held to on each
// pool (G*(x), from the blind policies).
func frontierTargets() []target {
	var ts []target
	for _, pool := range ipPools() {
		for _, prof := range ipProfiles() {
			k := pool.name() + "_" + prof.name + "_"
			ts = append(ts,
				reportedOnly(k+"best_goodput_at_p99_1_3", "G*(1.3): the best median goodput of a schedule-blind ideal policy whose median p99 ratio is ≤ 1.3"),
				reportedOnly(k+"best_goodput_at_p99_1_5", "G*(1.5): the same at p99 ≤ 1.5"),
				reportedOnly(k+"best_p99_at_goodput_0_8", "the best median p99 ratio of a schedule-blind ideal policy with goodput ≥ 0.80 (-1: none)"),
				reportedOnly(k+"best_p99_at_goodput_0_85", "the same at goodput ≥ 0.85 (-1: none)"),
				reportedOnly(k+"engine_max_goodput", "the max-goodput engine point's goodput (the engine preempting for every arrival, the victim keeping its tokens): not a bound"),
			)
		}
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

// podPolicies are pool-headroom with dispatch "pods" replayed: every pod
// read each 50 ms, its own reserve (idle reserve outside its bursts), its
// others' peak over the hold, its burst rule (threshold per pod, 2-s
// window, one rise per 50 ms), at most p placements per pod between
// readings, none on a pod where an arrival waited; a request taken back
// resumes on its pod with its tokens cached. Named
// pods-r<reserve>-i<idle>-t<threshold>-w<weight>-h<hold ms>-p<placements>.
func podPolicies(perPod, pods int) []frontierPolicy {
	type knobs struct {
		r, i, t int
		w       float64
		h       time.Duration
		p       int
		stay    bool
		e       time.Duration // reading period (0: 50 ms)
		k       float64       // pace in prefill tokens per second per pod (0: none)
		kb      float64       // the pace in a pod's burst (0: k)
	}
	var ks []knobs
	for _, r := range []int{2, 3, 4} {
		for _, i := range []int{1, r} {
			for _, h := range []time.Duration{250 * time.Millisecond, time.Second} {
				ks = append(ks, knobs{r, i, 3, 1, h, 1, false, 0, 0, 0}, knobs{r, i, 3, 2, h, 1, false, 0, 0, 0})
			}
		}
	}
	ks = append(ks, knobs{3, 1, 3, 1, 250 * time.Millisecond, 4, false, 0, 0, 0}, knobs{3, 1, 2, 1, 250 * time.Millisecond, 1, false, 0, 0, 0})
	for _, h := range []time.Duration{250 * time.Millisecond, time.Second} {
		for _, w := range []float64{1, 2} {
			ks = append(ks, knobs{2, 2, 3, w, h, 1, true, 0, 0, 0}, knobs{4, 4, 3, w, h, 1, true, 0, 0, 0}, knobs{2, 2, 3, w, h, 4, false, 0, 0, 0})
		}
	}
	// smaller reserves, for pods whose KV cache is not the limit
	// (vllm-8b-h100-16)
	for _, ri := range [][2]int{{0, 0}, {1, 0}, {1, 1}, {2, 0}, {2, 1}} {
		ks = append(ks, knobs{ri[0], ri[1], 3, 1, 250 * time.Millisecond, 1, true, 0, 0, 0})
	}
	// the pacing: more placements per pod between readings (each is a
	// batch prefill in the pod's next steps; on pods of 1,024 seats this,
	// not the seats, bounds what the batch adds to a step)
	for _, p := range []int{2, 4, 8, 16} {
		ks = append(ks, knobs{2, 2, 3, 1, 250 * time.Millisecond, p, true, 0, 0, 0})
	}
	// readings more often than the default 50 ms
	for _, e := range []time.Duration{10 * time.Millisecond, 20 * time.Millisecond} {
		for _, ri := range [][2]int{{0, 0}, {1, 1}, {2, 1}, {2, 2}} {
			ks = append(ks, knobs{ri[0], ri[1], 3, 1, 250 * time.Millisecond, 1, true, e, 0, 0})
		}
	}
	// the pace in tokens (pace_tokens): placements spaced by the prefill
	// they bring, read every 50 ms
	for _, tok := range []float64{12800, 19200, 22400, 25600, 38400, 51200} {
		for _, ri := range [][2]int{{0, 0}, {2, 2}} {
			ks = append(ks, knobs{ri[0], ri[1], 3, 1, 250 * time.Millisecond, 4, true, 0, tok, 0})
		}
	}
	// a slower pace in a pod's burst (burst_pace_tokens), with burst
	// thresholds that tell the bursts of vllm-8b-h100 from its idle
	// phases (3: always a burst there); only where the pace matters
	for _, t := range []int{3, 20, 40} {
		for _, kb := range []float64{12800, 6400} {
			for _, k := range []float64{25600, 38400} {
				if perPod > 64 {
					ks = append(ks, knobs{2, 2, t, 1, 250 * time.Millisecond, 4, true, 0, k, kb})
				}
			}
		}
	}
	var out []frontierPolicy
	for _, k := range ks {
		name := fmt.Sprintf("pods-r%d-i%d-t%d-w%g-h%d-p%d", k.r, k.i, k.t, k.w, k.h.Milliseconds(), k.p)
		if k.stay {
			name += "-stay"
		}
		if k.e > 0 {
			name += fmt.Sprintf("-e%d", k.e.Milliseconds())
		}
		if k.k > 0 {
			name += fmt.Sprintf("-k%g", k.k)
		}
		if k.kb > 0 {
			name += fmt.Sprintf("-b%g", k.kb)
		}
		out = append(out, frontierPolicy{name: name, blind: true, pending: k.p, stay: k.stay, read: k.e, pace: k.k, podLimit: func() (func(time.Duration, int, poolsim.Others) int, func(time.Duration, int) float64) {
			type state struct {
				rule  headroom.Rule
				peaks headroom.PeakHold
				burst bool
			}
			st := make([]*state, pods)
			for i := range st {
				st[i] = &state{rule: headroom.Rule{Seats: perPod, Reserve: k.r, IdleReserve: k.i,
					Burst: headroom.Burst{Threshold: k.t, Window: 2 * time.Second, Growth: 50 * time.Millisecond}}}
			}
			limit := func(at time.Duration, pod int, o poolsim.Others) int {
				s := st[pod]
				now := time.Unix(0, 0).Add(at)
				others := int(math.Ceil(float64(o.Running) + k.w*float64(o.Waiting)))
				burst, _, limit := s.rule.Apply(now, others, s.peaks.Held(now, k.h, others), o.Batch, -1)
				s.burst = burst
				return limit
			}
			if k.kb == 0 {
				return limit, nil
			}
			return limit, func(_ time.Duration, pod int) float64 {
				if st[pod].burst {
					return k.kb
				}
				return k.k
			}
		}})
	}
	return out
}
