package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/tools/internal/names"
	"github.com/sluice-io/sluice/transports/memory"
)

// The interactive-protection scenario: what sluice exists for. A simulated
// inference pool (internal/poolsim: vLLM-like engine pods behind an EPP-like
// front) serves interactive waves sent straight to the front — idle phases
// of ipIdleRate requests/s and burst phases of ipBurstRate requests/s, each
// a streamed 256-token prompt with 64 output tokens — while a batch of jobs
// with deadlines goes through sluice (memory transport, the pool's batch
// concurrency, objective batch-sheddable). It runs on every pool of
// ipPools (pools.go: the poolsim presets, dilated for real time where this
// machine needs it). Each arm changes one thing: the gate sluice uses, or
// the front's mode, or the engine's policy, or a peer's knob. The arms of
// one repetition run one after another on fresh pools, with the
// repetition's seed (so the same interactive arrivals); repetitions
// alternate the arm order; the floor and the recommended arm repeat
// ipRecReps times, the others ipOtherReps.
//
// Figures, per arm (one BENCH line each, arm=<name>):
//
//   - ttft_p50_ms, ttft_p99_ms: interactive time to first token, exact
//     percentiles over the requests that arrived in burst phases, measured
//     inside the simulator (arrival at the front → first token), so the
//     client's scheduling noise on this small machine does not enter;
//     ttft_p50_ratio and ttft_p99_ratio divide them by the floor arm's of
//     the same repetition (interactive only), median over repetitions;
//     for the recommended arm also ttft_p99_ratio_pooled over every
//     repetition's burst arrivals, with a 90 % bootstrap interval (_lo,
//     _hi; whole bursts resampled).
//   - ttft_idle_p99_ms, ttft_idle_p99_ratio: the same p99 over the idle
//     phases' arrivals after the warm-up (reported only: the bar judges
//     the bursts, and a dispatcher that protects them by filling the pool
//     between them shows here).
//   - batch_goodput_share: batch output tokens finished in the measured
//     window ÷ the pool's slack over that window. The slack is the batch's
//     capacity × (1 − the interactive seat share of the floor), both from
//     the virtual clock (ipModel), so that the real-time arms and their
//     replayed twins are judged on one scale.
//   - deadline_miss_rate: of the requests of the jobs whose deadline is at
//     least 2.5× their uncontended completion time, the share not answered
//     ok by their deadline; miss_rate_1_5x, miss_rate_2_5x and miss_rate_5x
//     per job.
//   - preemptions (engine), interactive_errors (interactive requests that
//     did not stream to the end), batch_rejections (front 429s).
//   - gate_reaction_ms: median over bursts of the time from a burst's start
//     to the first fall of the batch's occupancy of the pool (batch requests
//     running or waiting in the engines); gate_recovery_ms: from the
//     burst's end until the occupancy is back at its pre-burst level. A
//     burst with no fall counts as a whole phase.
//   - step_lag_p99_ms: how late the simulator's engine steps ran (real
//     milliseconds), step_lag_share the same over the mean step; an arm
//     the machine could not keep up with misses its step-lag target.
//
// Two profiles: short batch (512 prompt / 256 output tokens per request)
// and long batch (512 / 1024). The long profile adds arms that hold a fixed
// reserve of the pool's seats back from the batch (queue concurrency
// capped), and reports reserve_for_2x: the smallest reserve that kept
// ttft_p99_ratio ≤ 2.

const (
	ipScenario       = "interactive-protection"
	ipBurstRate      = 10.0            // interactive requests/s in a burst
	ipIdleRate       = 1.0             // interactive requests/s between bursts
	ipPhase          = 5 * time.Second // a profile's default phase length
	ipCycles         = 3
	ipInteractivePT  = 256
	ipInteractiveOut = 64
	ipSeed           = 20261201
	ipQueue          = "llm-d-async:requests:interactive-protection"
	ipResults        = "llm-d-async:results:interactive-protection"
	ipSampleEvery    = 50 * time.Millisecond
	ipInteractiveObj = "interactive-default"
	ipBatchObj       = "batch-sheddable"
	ipRecommendedArm = "headroom-resume-w2-t3"
	// ipPodArm is pool-headroom with dispatch "pods" (issue 42): the
	// batch placed on the pods by the gate, every rule per pod, a request
	// taken back resuming on its pod. It names each pool's own settings
	// (ipPodSettings); it runs as many repetitions as the recommended arm,
	// its p99 pooled the same way; its twin is frontierPodTwinFor(pool).
	ipPodArm      = "headroom-pods"
	ipUpstreamArm = "endpoint-scrape-upstream"
	ipRouterArm   = "router-flow-control"
	ipAIMDArm     = "aimd-tuned"
	// ipRecReps and ipOtherReps are the default repetitions of the floor
	// and the recommended arm (their p99 is pooled over every repetition's
	// burst arrivals) and of every other arm.
	ipRecReps   = 10
	ipOtherReps = 1
	// ipLongReps caps the long profile's repetitions: it is reported, not
	// held to the bar, and one of its arms lasts a minute per k.
	ipLongReps = 3
	// ipBootstrap is the number of bootstrap draws of a pooled p99's
	// interval.
	ipBootstrap = 2000
)

// ipPodSettings are the per-pod arm's settings on each pool, chosen from
// the replay (interactive-frontier's pods-* policies; docs/benchmarks.md,
// per-pod protection): reserve and idle reserve per pod, and readings
// (so placements) every 10 ms on the vLLM pools.
func ipPodSettings(preset string) string {
	switch preset {
	case "vllm-8b-h100-16":
		return "headroom-resume-pods-r0-i0-t3-w1-h250-e10"
	case "vllm-8b-h100":
		// the pace of the batch's prefill is what keeps this pool's steps
		// short: 25,600 prompt tokens a second per pod (docs/gates.md, the
		// pace in tokens)
		return "headroom-resume-pods-r2-i2-t3-w1-h250-pt25600"
	}
	return "headroom-resume-pods-r2-i2-t3-w1-h250"
}

// ipPooledArm reports whether arm n runs every repetition, its burst
// TTFTs pooled over them: the floor, the recommended arm and the per-pod
// arm.
func ipPooledArm(n string) bool { return n == "floor" || n == ipRecommendedArm || n == ipPodArm }

// ipPeers are the peers held against the recommended arm at matched
// goodput: each one's own knob swept (arm names as ipArmByName parses
// them).
func ipPeers() map[string][]string {
	return map[string][]string{
		// upstream's polling: one pod's waiting queue through a cache, its
		// max_count_per_pod and cache TTL swept
		ipUpstreamArm: {ipUpstreamArm + "-c1-ttl1000", ipUpstreamArm, ipUpstreamArm + "-c20-ttl1000"},
		// router flow control alone: its ceiling swept
		ipRouterArm: {ipRouterArm + "-c50", ipRouterArm, ipRouterArm + "-c150"},
		// aimd against the front's 429s: its initial window swept
		ipAIMDArm: {ipAIMDArm + "-w2", ipAIMDArm},
	}
}

// ipProfile is one batch profile and the arms it runs.
type ipProfile struct {
	name                     string
	batchPrompt, batchOutput int
	// warmup is the idle phase before the first burst, long enough for the
	// batch to reach its steady state (about one batch service time).
	warmup time.Duration
	// phase is the length of one burst and of one idle phase (0:
	// ipPhase; SLUICE_BENCH_IP_PHASE overrides every profile's).
	phase time.Duration
	arms  []string
}

// phaseLen is the profile's phase length.
func (p ipProfile) phaseLen() time.Duration {
	if p.phase > 0 {
		return p.phase
	}
	return ipPhase
}

func ipProfiles() []ipProfile {
	return []ipProfile{
		{name: "short", batchPrompt: 512, batchOutput: 256, warmup: 6 * time.Second, arms: append([]string{
			"floor", "ungated", "saturation-tuned", "engine-seat-preempt", "headroom-evict-w2", ipRecommendedArm, ipPodArm,
		}, ipPeerArms()...)},
		{name: "long", batchPrompt: 512, batchOutput: 1024, warmup: 30 * time.Second, arms: []string{
			"floor", "ungated", ipRecommendedArm, "aimd-tuned", "reserve-25", "reserve-50",
		}},
	}
}

// ipPeerArms are every peer's sweep, in a stable order.
func ipPeerArms() []string {
	var out []string
	for _, p := range []string{ipUpstreamArm, ipRouterArm, ipAIMDArm} {
		out = append(out, ipPeers()[p]...)
	}
	return out
}

// ipArm is how one arm sets up the pool and sluice.
type ipArm struct {
	// batch: sluice runs the batch (false: interactive only).
	batch bool
	// pool adjusts the simulated pool's configuration.
	pool func(*poolsim.Config)
	// gate is the batch queue's gate type and params (given the front's URL
	// and Prometheus's, "" when none runs); empty type: constant 1.
	gate func(front, prom string) (string, map[string]any)
	// concurrency caps the batch queue (0: the pool's).
	concurrency int
	// scrape > 0 starts a Prometheus scraping the front at this interval.
	scrape time.Duration
	// claimBatch > 0 sets the memory transport's claim batch size.
	claimBatch int
	// evict sets the batch queue's evict option, resume its resume option.
	evict, resume bool
	// replicas > 1 runs that many sluice replicas sharing one account
	// (headroom -x<n>; -noaccount: each counting only its own calls; see
	// interactive_replicas.go).
	replicas  int
	noAccount bool
}

func ipArmByName(name string, pool ipPool) (ipArm, error) {
	cfg := pool.config(ipSeed, true)
	perPod := cfg.Engine.MaxNumSeqs
	pods := cfg.Pods
	seats := pods * perPod
	dur := func(d time.Duration) string { return pool.dur(d, true).String() }
	poolName := cfg.Front.Pool
	satGate := func(ttl time.Duration) func(string, string) (string, map[string]any) {
		return func(_, prom string) (string, map[string]any) {
			return "prometheus-saturation", map[string]any{"inference_pool": poolName, "threshold": 0.8, "prometheus_url": prom, "cache_ttl": dur(ttl)}
		}
	}
	// knob reads the -<prefix><n> parts of a parametrised arm's name.
	knobs := func(rest string) (map[string]int, error) {
		out := map[string]int{}
		for _, part := range strings.Split(strings.TrimPrefix(rest, "-"), "-") {
			if part == "" {
				continue
			}
			i := strings.IndexFunc(part, func(r rune) bool { return r >= '0' && r <= '9' })
			if i <= 0 {
				return nil, fmt.Errorf("arm %q: part %q is not <knob><number>", name, part)
			}
			n, err := strconv.Atoi(part[i:])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("arm %q: part %q wants a count", name, part)
			}
			out[part[:i]] = n
		}
		return out, nil
	}
	switch name {
	case "floor":
		return ipArm{}, nil
	case "ungated":
		return ipArm{batch: true}, nil
	case "saturation-default":
		// upstream's defaults: --prometheus-cache-ttl 5s, a 5-s scrape.
		return ipArm{batch: true, scrape: pool.dur(5*time.Second, true), gate: satGate(5 * time.Second)}, nil
	case "saturation-tuned":
		return ipArm{batch: true, scrape: pool.dur(250*time.Millisecond, true), gate: satGate(250 * time.Millisecond)}, nil
	case "budget":
		return ipArm{batch: true, scrape: pool.dur(250*time.Millisecond, true), gate: func(_, prom string) (string, map[string]any) {
			return "prometheus-budget", map[string]any{"inference_pool": poolName, "max_concurrency": seats / 2, "baseline": 0.2, "prometheus_url": prom, "cache_ttl": dur(250 * time.Millisecond)}
		}}, nil
	case "aimd":
		return ipArm{batch: true, pool: func(c *poolsim.Config) { c.Front.Mode = poolsim.ModeLegacyAdmission },
			gate: func(string, string) (string, map[string]any) { return "aimd", map[string]any{} }}, nil
	case "engine-priority":
		return ipArm{batch: true, pool: func(c *poolsim.Config) { c.Engine.Policy = poolsim.PolicyPriority }}, nil
	case "engine-seat-preempt":
		// the upper bound: vLLM's open PRs #45561/#54530, a waiting
		// interactive request preempts a running batch one at max_num_seqs.
		return ipArm{batch: true, pool: func(c *poolsim.Config) {
			c.Engine.Policy, c.Engine.SeatPreempt = poolsim.PolicyPriority, true
		}}, nil
	case "oracle", frontierEngine:
		// the max-goodput engine point: the batch fills every seat, an
		// interactive arrival takes one at the next step, and the batch
		// request it displaced loses nothing (engine.PreemptKeep).
		return ipArm{batch: true, pool: func(c *poolsim.Config) {
			c.Engine.Policy, c.Engine.SeatPreempt, c.Engine.PreemptKeep = poolsim.PolicyPriority, true, true
		}}, nil
	}
	if rest, ok := strings.CutPrefix(name, ipAIMDArm); ok {
		// the front's concurrency detector, set to call the pool saturated
		// at 70 % of its seats: batch is refused while interactive traffic
		// needs the rest; -w<n>: aimd's initial window (default half the
		// pool's seats: a batch request holds its seat for seconds).
		k, err := knobs(rest)
		if err != nil {
			return ipArm{}, err
		}
		window := seats / 2
		if w, ok := k["w"]; ok && w > 0 {
			window = w
		}
		return ipArm{batch: true, pool: func(c *poolsim.Config) {
			c.Front.Mode, c.Front.Detector = poolsim.ModeLegacyAdmission, poolsim.DetectorConcurrency
			c.Front.MaxConcurrency = max(1, c.Engine.MaxNumSeqs*7/10)
		}, gate: func(string, string) (string, map[string]any) {
			return "aimd", map[string]any{"initial_window": window}
		}}, nil
	}
	if rest, ok := strings.CutPrefix(name, ipUpstreamArm); ok {
		// upstream's polling: one pod's waiting queue, read through a
		// cache (default 5 s), at most max_count_per_pod waiting (default
		// 5); claims of 10 at a time. -c<n>: max_count_per_pod;
		// -ttl<ms>: the cache TTL.
		k, err := knobs(rest)
		if err != nil {
			return ipArm{}, err
		}
		count, ttl := 5, 5*time.Second
		if c, ok := k["c"]; ok && c > 0 {
			count = c
		}
		if t, ok := k["ttl"]; ok && t > 0 {
			ttl = time.Duration(t) * time.Millisecond
		}
		return ipArm{batch: true, claimBatch: 10, gate: func(front, _ string) (string, map[string]any) {
			return "endpoint-scrape", map[string]any{"url": front + "/pods/0/metrics", "metric": "vllm:num_requests_waiting", "max_count_per_pod": count, "cache_ttl": dur(ttl)}
		}}, nil
	}
	if rest, ok := strings.CutPrefix(name, ipRouterArm); ok {
		// the EPP's flow control alone; -c<percent>: its ceiling.
		k, err := knobs(rest)
		if err != nil {
			return ipArm{}, err
		}
		ceiling := poolsim.DefaultCeiling
		if c, ok := k["c"]; ok && c > 0 {
			ceiling = float64(c) / 100
		}
		return ipArm{batch: true, pool: func(c *poolsim.Config) {
			c.Front.Mode, c.Front.Ceiling = poolsim.ModeFlowControl, ceiling
			c.Front.HoldbackMin = min(c.Front.HoldbackMin, ceiling)
		}}, nil
	}
	if rest, ok := strings.CutPrefix(name, "oracle-r"); ok {
		// the max-goodput engine point with r seats held back from the
		// batch (its queue capped)
		r, err := strconv.Atoi(rest)
		if err != nil || r <= 0 || r >= seats {
			return ipArm{}, fmt.Errorf("arm %q: oracle-r<n> needs 0 < n < %d seats", name, seats)
		}
		a, _ := ipArmByName("oracle", pool)
		a.concurrency = seats - r
		return a, nil
	}
	if name == ipPodArm {
		return ipArmByName(ipPodSettings(pool.name()), pool)
	}
	if rest, ok := strings.CutPrefix(name, "headroom"); ok {
		// pool-headroom: every pod's own gauges read each 50 ms, a
		// reserve of seats kept free; "-evict" takes batch requests back
		// when the reserve is eaten. "-resume" (implies evict) continues
		// them from the tokens they had made; "-t<n>" turns the burst rule
		// on (others ≥ n start a burst; "-i<seats>" is the reserve outside
		// bursts, default the same); "-x<n>" runs n replicas sharing one
		// account ("-noaccount": not sharing). Names: headroom[-evict|-resume][-pods[-p<placements>][-pt<prompt tokens per second per pod>][-pb<the same in a pod's bursts>][-nosteps]][-e<reading period, ms>][-r<seats>][-s<percent>][-w<waiting weight>][-h<hold ms>][-k<KV-cache limit, percent>][-t<burst threshold>][-i<idle reserve>][-x<replicas>[-noaccount]].
		a := ipArm{batch: true}
		reserve, share, weight, hold, kv, thr, idle := 4, 0.0, 1.0, time.Second, 0.0, 0, -1
		perPodDispatch, pending, refresh, pace, burstPace, noSteps := false, 0, headroom.DefaultRefreshInterval, 0.0, 0.0, false
		for _, part := range strings.Split(strings.TrimPrefix(rest, "-"), "-") {
			switch {
			case part == "":
			case part == "pods":
				// dispatch "pods": the batch goes to the pods the gate
				// places it on; every rule per pod
				perPodDispatch = true
			case strings.HasPrefix(part, "e"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n <= 0 {
					return ipArm{}, fmt.Errorf("arm %q: e<ms> wants a reading period in milliseconds, above 0", name)
				}
				refresh = time.Duration(n) * time.Millisecond
			case strings.HasPrefix(part, "pt") && perPodDispatch:
				n, err := strconv.Atoi(part[2:])
				if err != nil || n <= 0 {
					return ipArm{}, fmt.Errorf("arm %q: pt<tokens> wants a pace in prompt tokens per second per pod, above 0", name)
				}
				pace = float64(n)
				if pending == 0 {
					// the pace in tokens spaces the placements; four a
					// reading is more than it lets through on these pools
					pending = 4
				}
			case strings.HasPrefix(part, "pb") && perPodDispatch:
				n, err := strconv.Atoi(part[2:])
				if err != nil || n <= 0 {
					return ipArm{}, fmt.Errorf("arm %q: pb<tokens> wants a pace in a pod's bursts in prompt tokens per second per pod, above 0", name)
				}
				burstPace = float64(n)
			case strings.HasPrefix(part, "p") && perPodDispatch:
				n, err := strconv.Atoi(part[1:])
				if err != nil || n <= 0 {
					return ipArm{}, fmt.Errorf("arm %q: p<n> wants placements per pod between readings, above 0", name)
				}
				pending = n
			case strings.HasPrefix(part, "x"):
				var err error
				if a.replicas, err = ipReplicasPart(name, part); err != nil {
					return ipArm{}, err
				}
			case part == "noaccount":
				a.noAccount = true
			case part == "nosteps" && perPodDispatch:
				// the pods' step counts not read: every placement since
				// the previous reading counts as possibly waiting
				noSteps = true
			case part == "evict":
				a.evict = true
			case part == "resume":
				a.evict, a.resume = true, true
			case strings.HasPrefix(part, "r"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n < 0 {
					return ipArm{}, fmt.Errorf("arm %q: r<seats> wants a count", name)
				}
				reserve = n
			case strings.HasPrefix(part, "h"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n < 0 {
					return ipArm{}, fmt.Errorf("arm %q: h<ms> wants a hold in milliseconds", name)
				}
				hold = time.Duration(n) * time.Millisecond
				if n == 0 {
					hold = -1
				}
			case strings.HasPrefix(part, "w"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n < 0 {
					return ipArm{}, fmt.Errorf("arm %q: w<weight> wants a count", name)
				}
				weight = float64(n)
			case strings.HasPrefix(part, "t"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n <= 0 {
					return ipArm{}, fmt.Errorf("arm %q: t<n> wants a burst threshold above 0", name)
				}
				thr = n
			case strings.HasPrefix(part, "i"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n < 0 {
					return ipArm{}, fmt.Errorf("arm %q: i<seats> wants an idle reserve", name)
				}
				idle = n
			case strings.HasPrefix(part, "k"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n <= 0 || n > 100 {
					return ipArm{}, fmt.Errorf("arm %q: k<percent> wants a KV-cache limit in (0,100]", name)
				}
				kv = float64(n) / 100
			case strings.HasPrefix(part, "s"):
				n, err := strconv.Atoi(part[1:])
				if err != nil || n < 0 || n >= 100 {
					return ipArm{}, fmt.Errorf("arm %q: s<percent> wants a percentage in [0,100)", name)
				}
				share = float64(n) / 100
			default:
				return ipArm{}, fmt.Errorf("arm %q: unknown part %q", name, part)
			}
		}
		a.gate = func(front, _ string) (string, map[string]any) {
			eps := make([]string, pods)
			for i := range eps {
				eps[i] = fmt.Sprintf("%s/pods/%d/metrics", front, i)
			}
			holdS := "-1ns"
			if hold > 0 {
				holdS = dur(hold)
			}
			// every duration of the gate dilated with the pool: its
			// readings, hold and burst window keep their meaning in the
			// pool's time
			params := map[string]any{"endpoints": eps, "seats_per_pod": perPod, "reserve": reserve, "reserve_share": share, "waiting_weight": weight,
				"hold": holdS, "kv_limit": kv, "refresh_interval": dur(refresh), "burst_window": dur(headroom.DefaultBurstWindow)}
			if thr > 0 {
				params["burst_threshold"] = thr
			}
			if idle >= 0 {
				params["idle_reserve"] = idle
			}
			if perPodDispatch {
				params["dispatch"] = headroom.DispatchPods
				if pending > 0 {
					params["pending_prefills"] = pending
				}
				if pace > 0 {
					// a rate: the pool's time runs k times slower
					params["pace_tokens"] = pace / pool.k(true)
				}
				if burstPace > 0 {
					params["burst_pace_tokens"] = burstPace / pool.k(true)
				}
				if noSteps {
					params["step_metric"] = headroom.StepMetricNone
				}
			}
			return headroom.Type, params
		}
		return a, nil
	}
	if r, ok := strings.CutPrefix(name, "reserve-"); ok {
		pct, err := strconv.Atoi(r)
		if err != nil || pct <= 0 || pct >= 100 {
			return ipArm{}, fmt.Errorf("arm %q: reserve must be a percentage in (0,100)", name)
		}
		return ipArm{batch: true, concurrency: max(1, seats*(100-pct)/100)}, nil
	}
	return ipArm{}, fmt.Errorf("unknown arm %q", name)
}

// ipJobs are the batch: three judged jobs, due at 1.5×, 2.5× and 5× their
// uncontended completion time (EDF: job k finishes after jobs 1..k-1), then
// a filler job that keeps the batch busy to the end of the run.
type ipJobs struct {
	unit      int              // requests per judged job
	factors   [3]float64       // deadline ÷ uncontended completion time
	deadlines [3]time.Duration // from the batch's start
	filler    int
}

// ipCapacity is the batch alone on the pool as the real-time arms run it
// (ipPool.rtCapacity): from the virtual clock's model, so that every arm is
// judged on the scale its replayed twin is.
type ipCapacity struct {
	reqPerS, tokPerS float64
	service          time.Duration // median batch request service time (first token → last, on the model)
}

// rtCapacity is the model's capacity in the real-time arms' units: fewer
// pods carry proportionally less, and a dilated pool is k times slower.
func (p ipPool) rtCapacity(m ipModel) ipCapacity {
	f := p.podShare(true) / p.k(true)
	return ipCapacity{reqPerS: m.reqPerS * f, tokPerS: m.capTokS * f, service: p.dur(m.service, true)}
}

func (c ipCapacity) jobs(window time.Duration, concurrency int) ipJobs {
	j := ipJobs{factors: [3]float64{1.5, 2.5, 5}}
	j.unit = max(4, int(math.Round(c.reqPerS*2)))
	for k := range 3 {
		uncontended := c.service + time.Duration(float64(time.Second)*float64((k+1)*j.unit)/c.reqPerS)
		j.deadlines[k] = time.Duration(j.factors[k] * float64(uncontended))
	}
	j.filler = int(c.reqPerS*window.Seconds()) + 4*concurrency
	return j
}

// ipRun is one arm's raw result.
type ipRun struct {
	samples                []ipSample         // the batch's occupancy of the pool over the run
	bursts                 [][2]time.Duration // the burst phases, since the start
	ttft                   []float64          // ms, burst-phase interactive requests
	ttftByBurst            burstSample
	queued                 []float64 // ms from arrival to first scheduling, burst-phase interactive requests
	ttftIdle               []float64 // ms, interactive requests of the idle phases after the warm-up
	interactiveSeatS       float64   // seat-seconds the interactive requests took
	interactiveErrors      int
	batchTokens            float64 // completion tokens of the batch's ok results written in the window
	engineTokens           float64 // output tokens of the batch's engine calls that finished in the window
	window                 time.Duration
	judged, missed         [3]int
	preemptions            uint64
	prefixHits             float64 // prompt tokens the engines' prefix caches served
	rejections             uint64
	reaction, recovery     []float64 // ms per burst
	seatsIdle, seatsBurst  float64   // the batch's mean occupancy of the pool, idle and burst phases
	aborted, abortedTokens float64   // batch requests the pool saw aborted (evicted), and the output tokens they had made
	stepLagP99             float64   // ms, real time
	stepLagShare           float64   // the lag p99 over the mean step
	results, resultsOK     int
	duplicates, unknownR   int
}

// ipSelect applies SLUICE_BENCH_IP_PROFILES and SLUICE_BENCH_IP_ARMS (comma
// lists; empty: all) and SLUICE_BENCH_IP_PHASE (a phase length) for
// exploratory runs. The floor arm always runs: every
// ratio is to it.
func ipSelect(all []ipProfile) ([]ipProfile, error) {
	profs, arms := names.Set(os.Getenv("SLUICE_BENCH_IP_PROFILES")), names.Set(os.Getenv("SLUICE_BENCH_IP_ARMS"))
	var out []ipProfile
	for _, p := range all {
		if len(profs) > 0 && !profs[p.name] {
			continue
		}
		if len(arms) > 0 {
			p.arms = slices.DeleteFunc(slices.Clone(p.arms), func(a string) bool { return a != "floor" && !arms[a] })
			// an arm named with parameters (headroom-evict-r6-s25, reserve-30)
			// runs too, in the order given
			for _, a := range strings.Split(os.Getenv("SLUICE_BENCH_IP_ARMS"), ",") {
				if a = strings.TrimSpace(a); a != "" && !slices.Contains(p.arms, a) {
					if _, err := ipArmByName(a, ipPools()[0]); err != nil {
						return nil, err
					}
					p.arms = append(p.arms, a)
				}
			}
		}
		if v := os.Getenv("SLUICE_BENCH_IP_PHASE"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second {
				return nil, fmt.Errorf("SLUICE_BENCH_IP_PHASE=%q: want a duration of at least 1s", v)
			}
			p.phase = d
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("SLUICE_BENCH_IP_PROFILES=%q selects no profile", os.Getenv("SLUICE_BENCH_IP_PROFILES"))
	}
	return out, nil
}

// ipReps are the repetitions of the floor and the recommended arm
// (SLUICE_BENCH_IP_RUNS, default ipRecReps) and of every other arm
// (SLUICE_BENCH_IP_OTHER_RUNS, default ipOtherReps; at most the first).
// -runs does not apply: the scenario's repetitions are set by what its
// targets need (a pooled p99 with an interval), not by the other
// scenarios' default.
func ipReps() (rec, other int, err error) {
	rec, other = ipRecReps, ipOtherReps
	for _, v := range []struct {
		env string
		n   *int
	}{{"SLUICE_BENCH_IP_RUNS", &rec}, {"SLUICE_BENCH_IP_OTHER_RUNS", &other}} {
		if s := os.Getenv(v.env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return 0, 0, fmt.Errorf("%s=%q: want a count of at least 1", v.env, s)
			}
			*v.n = n
		}
	}
	return rec, min(other, rec), nil
}

func runInteractiveProtection(ctx context.Context, _ options) (figures, error) {
	summary := figures{}
	pools, err := ipSelectPools()
	if err != nil {
		return nil, err
	}
	profs, err := ipSelect(ipProfiles())
	if err != nil {
		return nil, err
	}
	for _, pool := range pools {
		for _, prof := range profs {
			f, err := ipRunProfile(ctx, pool, prof)
			if err != nil {
				return nil, fmt.Errorf("%s %s profile: %w", pool.name(), prof.name, err)
			}
			for k, v := range f {
				summary[pool.name()+"_"+prof.name+"_"+k] = v
			}
		}
	}
	return summary, nil
}

func ipRunProfile(ctx context.Context, pool ipPool, prof ipProfile) (figures, error) {
	recReps, otherReps, err := ipReps()
	if err != nil {
		return nil, err
	}
	if prof.name == "long" {
		recReps, otherReps = min(recReps, ipLongReps), min(otherReps, ipLongReps)
	}
	arms := map[string]ipArm{}
	for _, n := range prof.arms {
		a, err := ipArmByName(n, pool)
		if err != nil {
			return nil, err
		}
		arms[n] = a
	}
	model, err := pool.model(prof)
	if err != nil {
		return nil, fmt.Errorf("the pool's model: %w", err)
	}
	capy := pool.rtCapacity(model)
	waves := pool.waves(prof, ipSeed, ipCycles, true)
	window := waves.Length() - waves.Warmup
	jobs := capy.jobs(waves.Length(), pool.concurrency(true))
	// the slack in tokens over the real-time window: the model's, on the
	// pods that run (a dilated window holds the tokens of an undilated one)
	slack := model.slack(time.Duration(float64(window)/pool.k(true))) * pool.podShare(true)
	k := pool.k(true)
	fmt.Fprintf(os.Stderr, "bench: %s %s %s: k=%g pods=%d; batch capacity %.2f req/s %.0f tok/s, service %s (virtual clock, in real-time units); jobs of %d due at %v\n",
		ipScenario, pool.name(), prof.name, k, pool.config(ipSeed, true).Pods, capy.reqPerS, capy.tokPerS, capy.service.Round(time.Millisecond), jobs.unit, jobs.deadlines)
	perArm := map[string][]figures{}
	pooled := map[string]*[2]burstSample{} // burst and idle-phase TTFTs of every repetition
	for rep := range recReps {
		order := slices.Clone(prof.arms)
		if rep >= otherReps {
			order = slices.DeleteFunc(order, func(n string) bool { return !ipPooledArm(n) })
		}
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		seed := ipSeed + int64(rep)
		runs := map[string]*ipRun{}
		for _, n := range order {
			r, err := ipRunArm(ctx, pool, prof, arms[n], jobs, seed)
			if err != nil {
				return nil, fmt.Errorf("arm %s: %w", n, err)
			}
			runs[n] = r
			ipDumpSamples(fmt.Sprintf("%s_%s_%s_rep%d", pool.name(), prof.name, n, rep+1), r.samples, r.bursts, r.reaction)
			fmt.Fprintf(os.Stderr, "bench: %s %s %s %s rep %d: ttft p99 %.0f ms (÷k), batch %.0f tokens (%.2f of the slack), %d/%d results ok, step lag p99 %.1f ms (%.1f %% of a step)\n",
				ipScenario, pool.name(), prof.name, n, rep+1, percentile(slices.Clone(r.ttft), 0.99)/k, r.batchTokens, r.batchTokens/slack, r.resultsOK, r.results, r.stepLagP99, 100*r.stepLagShare)
			if ipPooledArm(n) {
				if pooled[n] == nil {
					pooled[n] = &[2]burstSample{}
				}
				pooled[n][0] = append(pooled[n][0], r.ttftByBurst...)
				pooled[n][1] = append(pooled[n][1], r.ttftIdle)
			}
		}
		for _, n := range order {
			perArm[n] = append(perArm[n], ipFigures(runs[n], runs["floor"], slack, arms[n], k))
		}
	}
	summary := figures{}
	med := map[string]figures{}
	for _, n := range prof.arms {
		f := medianFigures(perArm[n])
		f["reps"] = float64(len(perArm[n]))
		if n != "floor" && pooled[n] != nil && pooled["floor"] != nil {
			f["ttft_p99_ratio_pooled"], f["ttft_p99_ratio_lo"], f["ttft_p99_ratio_hi"] = pooledP99Ratio(pooled[n][0], pooled["floor"][0], ipBootstrap, uint64(ipSeed))
			f["ttft_idle_p99_ratio_pooled"], _, _ = pooledP99Ratio(pooled[n][1], pooled["floor"][1], 0, 0)
			f["burst_arrivals_pooled"] = float64(len(slices.Concat(pooled[n][0]...)))
		}
		med[n] = f
		fmt.Println(ipLine(pool, prof.name, n, f))
		summary["step_lag_share_max"] = max(summary["step_lag_share_max"], f["step_lag_share"])
		summary["step_lag_p99_ms_max"] = max(summary["step_lag_p99_ms_max"], f["step_lag_p99_ms"])
		for _, key := range []string{"interactive_errors", "duplicate_results", "unknown_results"} {
			summary[key] += f[key]
		}
	}
	summary["dilation"] = k
	for _, arm := range []string{ipRecommendedArm, ipPodArm} {
		for _, key := range []string{"ttft_p99_ratio_pooled", "ttft_p99_ratio_lo", "ttft_p99_ratio_hi", "ttft_idle_p99_ratio_pooled",
			"batch_goodput_share", "deadline_miss_rate", "gate_reaction_ms", "reps", "batch_aborted_per_request"} {
			if v, ok := med[arm][key]; ok {
				summary[arm+"_"+key] = v
			}
		}
	}
	rec, ok := med[ipRecommendedArm]
	if !ok {
		return summary, nil
	}
	if prof.name == "long" {
		// the smallest reserve of seats (percent) that kept p99 ≤ 2×
		summary["reserve_for_2x"] = -1
		for _, n := range prof.arms {
			if pct, ok := strings.CutPrefix(n, "reserve-"); ok {
				p, _ := strconv.Atoi(pct)
				if med[n]["ttft_p99_ratio"] <= 2 && (summary["reserve_for_2x"] < 0 || float64(p) < summary["reserve_for_2x"]) {
					summary["reserve_for_2x"] = float64(p)
				}
			}
		}
	}
	if prof.name != "short" {
		return summary, nil
	}
	// The bar, from the frontier of the same pool (the short profile's):
	// G*(x) of the schedule-blind ideal policies.
	fr, err := frontierFor(pool, prof)
	if err != nil {
		return nil, fmt.Errorf("the frontier: %w", err)
	}
	bar := ipBarFor(pool.name())
	g := fr.goodputAt(bar.p99)
	summary["frontier_goodput_at_bar"] = g
	summary["goodput_bar"] = bar.goodputBar(g)
	// One clock: the recommended arm against its replayed twin.
	if twin, ok := fr.median[frontierTwin]; ok {
		summary["twin_goodput"] = twin["batch_goodput_share"]
		summary["twin_p99_ratio"] = twin["ttft_p99_ratio"]
		summary["twin_goodput_diff"] = math.Abs(rec["batch_goodput_share"] - twin["batch_goodput_share"])
		summary["twin_p99_diff"] = math.Abs(rec["ttft_p99_ratio_pooled"] - twin["ttft_p99_ratio"])
	}
	if pods, ok := med[ipPodArm]; ok {
		if twin, ok := fr.median[frontierPodTwinFor(pool.name())]; ok {
			summary["pods_twin_goodput"] = twin["batch_goodput_share"]
			summary["pods_twin_p99_ratio"] = twin["ttft_p99_ratio"]
			summary["pods_twin_goodput_diff"] = math.Abs(pods["batch_goodput_share"] - twin["batch_goodput_share"])
			summary["pods_twin_p99_diff"] = math.Abs(pods["ttft_p99_ratio_pooled"] - twin["ttft_p99_ratio"])
		}
	}
	// Peers at matched goodput: each peer's p99 interpolated at sluice's
	// goodput along its own sweep.
	self := peerPoint{goodput: rec["batch_goodput_share"], p99: rec["ttft_p99_ratio_pooled"]}
	dominated := false
	for peer, sweep := range ipPeers() {
		var pts []peerPoint
		for _, n := range sweep {
			if f, ok := med[n]; ok {
				pt := peerPoint{goodput: f["batch_goodput_share"], p99: f["ttft_p99_ratio"]}
				pts = append(pts, pt)
				dominated = dominated || pt.dominates(self)
			}
		}
		if len(pts) == 0 {
			continue
		}
		p99, ok := p99AtGoodput(pts, self.goodput, 0.03)
		if !ok {
			// the peer's knob does not bring it to sluice's goodput: no
			// comparison at matched goodput; its nearest setting is printed
			near := slices.MinFunc(pts, func(a, b peerPoint) int {
				return cmp.Compare(math.Abs(a.goodput-self.goodput), math.Abs(b.goodput-self.goodput))
			})
			summary["peer_"+peer+"_p99_at_goodput"] = -1
			summary["peer_"+peer+"_nearest_goodput"], summary["peer_"+peer+"_nearest_p99"] = near.goodput, near.p99
			summary["fifth_of_"+peer] = 0
			continue
		}
		summary["peer_"+peer+"_p99_at_goodput"] = p99
		summary["fifth_of_"+peer] = b2f(self.p99 <= p99/5)
	}
	summary["no_peer_dominates"] = b2f(!dominated)
	return summary, nil
}

// ipBar is the recommended arm's bar on one pool (issue 41).
type ipBar struct {
	p99, p99Hi, idle float64 // pooled p99 ratio, its interval's upper bound, idle-phase p99 ratio
	// goodput is the fixed goodput bar (0: none), slack what the bar may
	// sit below G*(p99) instead
	goodput, slack float64
}

// goodputBar is the goodput the recommended arm must reach given g =
// G*(p99): the fixed bar where the frontier reaches it, else g − slack;
// with no fixed bar, g − slack.
func (b ipBar) goodputBar(g float64) float64 {
	if b.goodput > 0 && g >= b.goodput {
		return b.goodput
	}
	return g - b.slack
}

func ipBarFor(pool string) ipBar {
	if pool == poolsim.PresetStress {
		return ipBar{p99: 1.5, p99Hi: 1.7, idle: 2.0, slack: 0.04}
	}
	return ipBar{p99: 1.3, p99Hi: 1.45, idle: 1.5, goodput: 0.85, slack: 0.05}
}

// ipFigures turns one arm's run into its figures, against the floor arm of
// the same repetition.
func ipFigures(r, floor *ipRun, slack float64, a ipArm, k float64) figures {
	f := figures{
		"ttft_p50_ms":        percentile(slices.Clone(r.ttft), 0.50) / k,
		"ttft_p99_ms":        percentile(slices.Clone(r.ttft), 0.99) / k,
		"step_lag_share":     r.stepLagShare,
		"interactive_errors": float64(r.interactiveErrors),
		"preemptions":        float64(r.preemptions),
		"prefix_hit_tokens":  r.prefixHits,
		"batch_rejections":   float64(r.rejections),
		"step_lag_p99_ms":    r.stepLagP99,
		"interactive_burst":  float64(len(r.ttft)),
		// how long burst-phase interactive requests waited for a seat
		"queued_p99_ms": percentile(slices.Clone(r.queued), 0.99) / k,
	}
	if p := percentile(slices.Clone(floor.ttft), 0.50) / k; p > 0 {
		f["ttft_p50_ratio"] = f["ttft_p50_ms"] / p
	}
	if p := percentile(slices.Clone(floor.ttft), 0.99) / k; p > 0 {
		f["ttft_p99_ratio"] = f["ttft_p99_ms"] / p
	}
	// The idle phases' arrivals after the warm-up, which the bar does not
	// judge: a dispatcher that protects the bursts by flooding the pool
	// between them shows here.
	if len(r.ttftIdle) > 0 {
		f["ttft_idle_p99_ms"] = percentile(slices.Clone(r.ttftIdle), 0.99) / k
		if p := percentile(slices.Clone(floor.ttftIdle), 0.99) / k; p > 0 {
			f["ttft_idle_p99_ratio"] = f["ttft_idle_p99_ms"] / p
		}
	}
	if !a.batch {
		return f
	}
	f["batch_tokens"] = r.batchTokens
	f["batch_engine_tokens"] = r.engineTokens
	if slack > 0 {
		f["batch_goodput_share"] = r.batchTokens / slack
	}
	names := [3]string{"miss_rate_1_5x", "miss_rate_2_5x", "miss_rate_5x"}
	var judged, missed int
	for k := range 3 {
		if r.judged[k] > 0 {
			f[names[k]] = float64(r.missed[k]) / float64(r.judged[k])
		}
		if k >= 1 { // the jobs with ≥ 2.5× slack
			judged += r.judged[k]
			missed += r.missed[k]
		}
	}
	if judged > 0 {
		f["deadline_miss_rate"] = float64(missed) / float64(judged)
	}
	f["duplicate_results"] = float64(r.duplicates)
	f["unknown_results"] = float64(r.unknownR)
	f["batch_aborted"] = r.aborted
	if r.results > 0 {
		// take-backs per batch request that ended (issue 42's replicas
		// must take back no more per request than one replica)
		f["batch_aborted_per_request"] = r.aborted / float64(r.results)
	}
	f["batch_aborted_tokens"] = r.abortedTokens
	f["batch_seats_idle"] = r.seatsIdle
	f["batch_seats_burst"] = r.seatsBurst
	f["gate_reaction_ms"] = median(slices.Clone(r.reaction)) / k
	f["gate_recovery_ms"] = median(slices.Clone(r.recovery)) / k
	return f
}

// medianFigures is the per-key median over repetitions.
func medianFigures(fs []figures) figures {
	out := figures{}
	keys := map[string]bool{}
	for _, f := range fs {
		for k := range f {
			keys[k] = true
		}
	}
	for k := range keys {
		var xs []float64
		for _, f := range fs {
			if v, ok := f[k]; ok {
				xs = append(xs, v)
			}
		}
		out[k] = median(xs)
	}
	return out
}

func ipLine(pool ipPool, profile, arm string, f figures) string {
	line := format(ipScenario, f)
	return fmt.Sprintf("BENCH %s preset=%s k=%g pods=%d profile=%s arm=%s%s", ipScenario, pool.name(), pool.k(true), pool.config(ipSeed, true).Pods,
		profile, arm, line[len("BENCH "+ipScenario):])
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ipTargets are the scenario's targets (issue 41), per pool. Every arm:
// the simulator kept in time (step lag p99 ≤ 5 % of a step), no
// interactive errors, exactly one result per batch request. The short
// profile's recommended arm (pool-headroom with evict, resume and the
// burst rule), against G*(x), the best goodput of a schedule-blind ideal
// policy of the same pool's frontier at p99 ≤ x:
//   - stress: pooled p99 ratio ≤ 1.5 (interval's upper bound ≤ 1.7) at
//     goodput ≥ G*(1.5) − 0.04; idle-phase p99 ≤ 2.0;
//   - vllm-8b-h100-16 and vllm-8b-h100: p99 ≤ 1.3 (upper bound ≤ 1.45)
//     at goodput ≥ 0.85, or G*(1.3) − 0.05 where the frontier itself
//     does not reach 0.85 at 1.3 (goodput_bar says which); idle-phase
//     p99 ≤ 1.5;
//   - every pool: no deadline misses for jobs due at ≥ 2.5× their
//     uncontended time; gate_reaction_ms ≤ 1,500; against each peer
//     (upstream-style polling, router flow control, aimd), its p99
//     interpolated along its own knob's sweep at sluice's goodput (±0.03)
//     is at least 5× sluice's, and no peer point is better on both axes;
//   - one clock: within ±0.05 of goodput and ±0.2 of p99 ratio of its
//     replayed twin.
//
// The long profile is reported as measured.
func ipTargets() []target {
	var ts []target
	for _, pool := range ipPools() {
		for _, prof := range ipProfiles() {
			k := pool.name() + "_" + prof.name + "_"
			ts = append(ts,
				maximum(k+"step_lag_share_max", 0.05, "the simulator's steps ran on time in every arm (lag p99 ≤ 5 % of a step): else the machine could not keep up and the figures are no measurement"),
				exactly(k+"interactive_errors", 0, "every interactive request streamed to the end, in every arm"),
				exactly(k+"duplicate_results", 0, "exactly one result per batch request, in every arm"),
				exactly(k+"unknown_results", 0, "no result for a request nobody sent"),
			)
		}
		bar := ipBarFor(pool.name())
		r := pool.name() + "_short_" + ipRecommendedArm + "_"
		s := pool.name() + "_short_"
		ts = append(ts,
			maximum(r+"ttft_p99_ratio_pooled", bar.p99, "issue 41: interactive burst p99 (pooled over the repetitions) within its bar of the floor while the batch runs"),
			maximum(r+"ttft_p99_ratio_hi", bar.p99Hi, "issue 41: the pooled p99's 90 % bootstrap interval stays under its upper bar"),
			maximum(r+"ttft_idle_p99_ratio_pooled", bar.idle, "issue 41: the idle phases are not flooded to buy the bursts"),
			noLess(r+"batch_goodput_share", s+"goodput_bar", "issue 41: the batch's goodput against the frontier's G*(x) of the same pool"),
			exactly(r+"deadline_miss_rate", 0, "no misses for jobs with ≥ 2.5× slack"),
			maximum(r+"gate_reaction_ms", 1500, "the batch yields within 1.5 s of a burst"),
			maximum(s+"twin_goodput_diff", 0.05, "one clock: the real-time arm's goodput within 0.05 of its replayed twin's"),
			maximum(s+"twin_p99_diff", 0.2, "one clock: the real-time arm's p99 ratio within 0.2 of its replayed twin's"),
			exactly(s+"no_peer_dominates", 1, "no peer setting beats the recommended arm on both goodput and p99"),
			reportedOnly(pool.name()+"_long_reserve_for_2x", "the smallest reserve of seats (percent) that kept p99 ≤ 2× with long batch requests; -1: none of those tried"),
			reportedOnly(s+"goodput_bar", "the goodput the recommended arm must reach: the fixed bar, or G*(x) less the slack the issue allows"),
			reportedOnly(s+"frontier_goodput_at_bar", "G*(x) at the pool's p99 bar, from interactive-frontier"),
		)
		// issue 42: the per-pod arm held to the same bar, and to its twin
		pa := pool.name() + "_short_" + ipPodArm + "_"
		ts = append(ts,
			maximum(pa+"ttft_p99_ratio_pooled", bar.p99, "issue 42: per-pod dispatch, interactive burst p99 (pooled) within the pool's bar"),
			maximum(pa+"ttft_p99_ratio_hi", bar.p99Hi, "issue 42: per-pod dispatch, the pooled p99's 90 % interval under its upper bar"),
			maximum(pa+"ttft_idle_p99_ratio_pooled", bar.idle, "issue 42: per-pod dispatch, the idle phases not flooded"),
			noLess(pa+"batch_goodput_share", s+"goodput_bar", "issue 42: per-pod dispatch, the batch's goodput against the frontier's G*(x)"),
			exactly(pa+"deadline_miss_rate", 0, "issue 42: per-pod dispatch, no misses for jobs with ≥ 2.5× slack"),
			maximum(s+"pods_twin_goodput_diff", 0.05, "issue 42: one clock, the per-pod arm's goodput within 0.05 of its replayed twin's"),
			maximum(s+"pods_twin_p99_diff", 0.2, "issue 42: one clock, the per-pod arm's p99 ratio within 0.2 of its replayed twin's"),
		)
		for _, peer := range []string{ipUpstreamArm, ipRouterArm, ipAIMDArm} {
			ts = append(ts, exactly(s+"fifth_of_"+peer, 1, "the recommended arm's p99 ratio ≤ ⅕ of "+peer+"'s at the same goodput (interpolated along its knob's sweep)"))
		}
	}
	return ts
}

// ipPodCounter sums a counter over the pool's pods (the front's /metrics
// carries every pod's series).
func ipPodCounter(ctx context.Context, front, metric string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, front+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	sum, seen := 0.0, false
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("bad sample %q: %w", line, err)
		}
		sum, seen = sum+v, true
	}
	if !seen {
		return 0, errors.New("no " + metric + " series on " + front + "/metrics")
	}
	return sum, nil
}

func ipStartPool(ctx context.Context, base poolsim.Config, adjust func(*poolsim.Config), onRecord func(poolsim.Record)) (*poolsim.Pool, string, error) {
	cfg := base
	if adjust != nil {
		adjust(&cfg)
	}
	pool, err := poolsim.New(cfg)
	if err != nil {
		return nil, "", err
	}
	pool.OnRecord(onRecord)
	if err := pool.Start(ctx); err != nil {
		return nil, "", err
	}
	url, err := pool.Listen("127.0.0.1:0")
	if err != nil {
		_ = pool.Close()
		return nil, "", err
	}
	return pool, url, nil
}

// ipSluice is sluice running the batch (one app per replica).
type ipSluice struct {
	apps  []*app.App
	mem   *memory.Transport
	stop  func()
	ids   map[string]int // request id → judged job (0..2), or -1 for the filler
	start time.Time
}

func ipStartSluice(ctx context.Context, front, prom string, a ipArm, prof ipProfile, jobs ipJobs, start time.Time, concurrency int) (*ipSluice, error) {
	mem := memory.New(memory.Options{BatchSize: a.claimBatch})
	evict := a.evict
	gateType, params := constant.Type, map[string]any{"budget": 1}
	if a.gate != nil {
		gateType, params = a.gate(front, prom)
	}
	raw := map[string]json.RawMessage{}
	for k, v := range params {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		raw[k] = b
	}
	conc := concurrency
	if a.concurrency > 0 {
		conc = a.concurrency
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: conc, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: ipResults, Queues: []config.Queue{{
			Queue: transport.Queue{Name: ipQueue}, IGWBaseURL: front, RequestPathURL: "/v1/completions",
			InferenceObjective: ipBatchObj, GateType: gateType, GateParams: raw, Evict: evict, Resume: a.resume,
		}}},
	}
	apps, closeApps, err := ipApps(cfg, mem, a.replicas, !a.noAccount)
	if err != nil {
		return nil, err
	}
	s := &ipSluice{apps: apps, mem: mem, ids: map[string]int{}, start: start}
	// a text prompt, which a resumed request continues by appending the
	// text made (token ids could not be), distinct per request as a real
	// batch's prompts are (the pools cache prefixes)
	n := uint64(0)
	enqueue := func(id string, job int, deadline time.Time) error {
		s.ids[id] = job
		n++
		b := fmt.Appendf(nil, `{"id":%q,"deadline":%.3f,"payload":{"model":%q,"prompt":%s,"max_tokens":%d}}`,
			id, float64(deadline.UnixMilli())/1000, poolsim.DefaultModelName, poolsim.TextPromptFor(prof.batchPrompt, n), prof.batchOutput)
		return mem.Enqueue(ipQueue, b)
	}
	for k := range 3 {
		for i := range jobs.unit {
			if err := enqueue(fmt.Sprintf("j%d-%d", k, i), k, start.Add(jobs.deadlines[k])); err != nil {
				return nil, err
			}
		}
	}
	for i := range jobs.filler {
		if err := enqueue(fmt.Sprintf("f-%d", i), -1, start.Add(time.Hour)); err != nil {
			return nil, err
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, len(apps))
	for _, ap := range apps {
		go func() { errc <- ap.Run(runCtx) }()
	}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			for range apps {
				if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
					fmt.Fprintf(os.Stderr, "bench: %s: sluice: %v\n", ipScenario, err)
				}
			}
			closeApps()
		})
	}
	return s, nil
}

// ipRunArm runs one arm on a fresh pool, with the repetition's seed (the
// pool's draws and the interactive arrivals).
func ipRunArm(ctx context.Context, ipp ipPool, prof ipProfile, a ipArm, jobs ipJobs, seed int64) (*ipRun, error) {
	base := ipp.config(seed, true)
	base.Engine.StepJitter = frontierJitter
	var mu sync.Mutex
	var recs []poolsim.Record
	pool, front, err := ipStartPool(ctx, base, a.pool, func(r poolsim.Record) {
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	prom := ""
	if a.scrape > 0 {
		dir, err := os.MkdirTemp("", "sluice-bench-prom-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		p, err := testenv.StartPrometheusProcess(testenv.PrometheusOptions{ScrapeInterval: a.scrape,
			Targets: []testenv.ScrapeTarget{{URL: front + "/metrics"}}}, 0, dir)
		if err != nil {
			return nil, err
		}
		defer p.Stop()
		prom = p.URL
	}
	waves := ipp.waves(prof, uint64(seed), ipCycles, true)
	arrivals, bursts := waves.Schedule()
	start := time.Now()
	var sl *ipSluice
	if a.batch {
		if sl, err = ipStartSluice(ctx, front, prom, a, prof, jobs, start, ipp.concurrency(true)); err != nil {
			return nil, err
		}
		defer sl.stop()
	}
	// the batch's occupancy of the pool (running + waiting), sampled
	var samples []ipSample
	sampleDone := make(chan struct{})
	sampleCtx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampleDone)
		if sl == nil {
			return
		}
		t := time.NewTicker(ipSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case now := <-t.C:
				var batch int
				for _, g := range pool.PodGauges() {
					batch += g.RunningByClass[poolsim.ClassBatch] + g.WaitingByClass[poolsim.ClassBatch]
				}
				samples = append(samples, ipSample{at: now.Sub(start), limit: float64(batch)})
			}
		}
	}()
	// results, as they come
	resultAt := map[string]time.Duration{}
	var resultsMu sync.Mutex
	var res []*wire.Result
	resultsDone := make(chan struct{})
	if sl != nil {
		go func() {
			defer close(resultsDone)
			seen := 0
			for {
				n, changed := sl.mem.ResultCount(ipResults)
				if n > seen {
					all := sl.mem.Results(ipResults)
					now := time.Since(start)
					resultsMu.Lock()
					for _, b := range all[seen:] {
						r, err := wire.DecodeResult(b)
						if err != nil {
							continue
						}
						res = append(res, r)
						if _, dup := resultAt[r.ID]; !dup {
							resultAt[r.ID] = now
						}
					}
					resultsMu.Unlock()
					seen = len(all)
				}
				select {
				case <-sampleCtx.Done():
					return
				case <-changed:
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	} else {
		close(resultsDone)
	}
	client := &poolsim.Client{Front: front, PromptTokens: ipInteractivePT, MaxTokens: ipInteractiveOut, Objective: ipInteractiveObj}
	errs := client.Drive(ctx, start, arrivals)
	end := time.Since(start)
	stopSampling()
	<-sampleDone
	<-resultsDone
	if sl != nil {
		sl.stop()
	}
	stats := pool.Stats()
	lag := pool.StepLag()
	hits, err := ipPodCounter(ctx, front, poolsim.MetricPrefixHits)
	if err != nil {
		return nil, fmt.Errorf("reading the pods' prefix-cache hits: %w", err)
	}

	r := &ipRun{interactiveErrors: errs, window: end - waves.Warmup, stepLagP99: float64(lag.P99) / float64(time.Millisecond), prefixHits: hits}
	if lag.MeanStep > 0 {
		r.stepLagShare = float64(lag.P99) / float64(lag.MeanStep)
	}
	for _, c := range stats.Classes {
		r.preemptions += c.Preemptions
	}
	r.rejections = stats.Classes[poolsim.ClassBatch].Rejected
	mu.Lock()
	for _, rec := range recs {
		at := rec.Arrival.Sub(start)
		switch rec.Class {
		case poolsim.ClassInteractive:
			if !rec.FirstToken.IsZero() && poolsim.InBurst(bursts, at) {
				r.ttft = append(r.ttft, float64(rec.TTFT())/float64(time.Millisecond))
				if b := burstIndex(bursts, at); b >= 0 {
					for len(r.ttftByBurst) <= b {
						r.ttftByBurst = append(r.ttftByBurst, nil)
					}
					r.ttftByBurst[b] = append(r.ttftByBurst[b], float64(rec.TTFT())/float64(time.Millisecond))
				}
				r.queued = append(r.queued, float64(rec.FirstScheduled.Sub(rec.Arrival))/float64(time.Millisecond))
			} else if !rec.FirstToken.IsZero() && at >= waves.Warmup {
				r.ttftIdle = append(r.ttftIdle, float64(rec.TTFT())/float64(time.Millisecond))
			}
			if !rec.FirstScheduled.IsZero() && !rec.Finished.IsZero() && at >= waves.Warmup {
				r.interactiveSeatS += rec.Finished.Sub(rec.FirstScheduled).Seconds()
			}
		case poolsim.ClassBatch:
			fin := rec.Finished.Sub(start)
			if rec.FinishReason != "abort" && fin >= waves.Warmup && fin <= end {
				r.engineTokens += float64(rec.OutputTokens)
			}
			if rec.FinishReason == "abort" && fin <= end {
				r.abortedTokens += float64(rec.OutputTokens)
				r.aborted++
			}
		}
	}
	mu.Unlock()
	if sl != nil {
		ipJudge(r, sl, res, resultAt, jobs, end)
		r.batchTokens = ipResultTokens(res, resultAt, waves.Warmup, end)
		r.reaction, r.recovery = ipReaction(samples, bursts, waves.Burst)
		r.seatsIdle, r.seatsBurst = ipOccupancy(samples, bursts, waves.Warmup)
		r.samples, r.bursts = samples, bursts
	}
	return r, nil
}

// ipDumpSamples writes, when SLUICE_BENCH_IP_SAMPLES names a directory,
// the batch's occupancy samples of one run (name.csv: ms since the start,
// requests) and its bursts with their reactions (name.bursts.csv), to see
// how the batch yields where gate_reaction_ms alone does not say. Times
// are the run's: real milliseconds in real time (the pool's time × k).
func ipDumpSamples(name string, samples []ipSample, bursts [][2]time.Duration, reaction []float64) {
	dir := os.Getenv("SLUICE_BENCH_IP_SAMPLES")
	if dir == "" {
		return
	}
	var b strings.Builder
	b.WriteString("ms,batch\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%d,%g\n", s.at.Milliseconds(), s.limit)
	}
	var bb strings.Builder
	bb.WriteString("start_ms,end_ms,reaction_ms\n")
	for i, x := range bursts {
		re := -1.0
		if i < len(reaction) {
			re = reaction[i]
		}
		fmt.Fprintf(&bb, "%d,%d,%g\n", x[0].Milliseconds(), x[1].Milliseconds(), re)
	}
	name = strings.NewReplacer("/", "_", " ", "_").Replace(name)
	for file, text := range map[string]string{name + ".csv": b.String(), name + ".bursts.csv": bb.String()} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "bench: SLUICE_BENCH_IP_SAMPLES: %v\n", err)
		}
	}
}

// burstIndex is the index of the burst phase t falls in, or -1.
func burstIndex(bursts [][2]time.Duration, t time.Duration) int {
	for i, b := range bursts {
		if t >= b[0] && t < b[1] {
			return i
		}
	}
	return -1
}

// ipOccupancy is the batch's mean occupancy of the pool (requests running
// or waiting in the engines) over the idle phases after the warm-up and
// over the burst phases.
func ipOccupancy(samples []ipSample, bursts [][2]time.Duration, warmup time.Duration) (idle, burst float64) {
	var ni, nb float64
	for _, s := range samples {
		if s.at < warmup {
			continue
		}
		if poolsim.InBurst(bursts, s.at) {
			burst += s.limit
			nb++
		} else {
			idle += s.limit
			ni++
		}
	}
	return idle / max(1, ni), burst / max(1, nb)
}

type ipSample struct {
	at    time.Duration
	limit float64 // batch requests running or waiting in the pool
}

// ipReaction measures, per burst, how long the batch's occupancy of the
// pool took to fall (by at least max(2, 10 %) requests, so the gap between
// a completion and its replacement is not a fall) after the burst began,
// and to come back to its pre-burst level after the burst ended. It is
// the pool's view, so it holds for every arm: an arm that never yields
// seats scores a whole phase.
func ipReaction(samples []ipSample, bursts [][2]time.Duration, phase time.Duration) (reaction, recovery []float64) {
	at := func(t time.Duration) (float64, int) {
		for i, s := range samples {
			if s.at >= t {
				return s.limit, i
			}
		}
		return 0, -1
	}
	for _, b := range bursts {
		before, i := at(b[0])
		if i < 0 {
			continue
		}
		fell := float64(phase.Milliseconds())
		for _, s := range samples[i:] {
			if s.at >= b[1] {
				break
			}
			if s.limit <= before-max(2, before/10) {
				fell = float64((s.at - b[0]).Milliseconds())
				break
			}
		}
		reaction = append(reaction, fell)
		_, j := at(b[1])
		if j < 0 {
			continue
		}
		back := float64(phase.Milliseconds())
		for _, s := range samples[j:] {
			if s.at >= b[1]+phase {
				break
			}
			if s.limit >= before {
				back = float64((s.at - b[1]).Milliseconds())
				break
			}
		}
		recovery = append(recovery, back)
	}
	return reaction, recovery
}

// ipResultTokens is the batch's goodput in tokens: the completion tokens
// (usage) of the ok results written within [from, to]. It is what the
// batch's owner receives, so a resumed request counts the tokens its
// aborted calls made (they are in its answer) and a restarted one counts
// its tokens once; the engines' own count (engineTokens) is the
// cross-check for the arms that do not resume.
func ipResultTokens(res []*wire.Result, at map[string]time.Duration, from, to time.Duration) float64 {
	n := 0.0
	seen := map[string]bool{}
	for _, x := range res {
		t, ok := at[x.ID]
		if !x.OK() || !ok || t < from || t > to || seen[x.ID] {
			continue
		}
		seen[x.ID] = true
		if _, out, ok := dispatch.ParseUsage([]byte(x.Payload)); ok {
			n += float64(out)
		}
	}
	return n
}

// ipJudge counts the judged jobs' misses and checks exactly one result per
// request.
func ipJudge(r *ipRun, sl *ipSluice, res []*wire.Result, at map[string]time.Duration, jobs ipJobs, end time.Duration) {
	count := map[string]int{}
	ok := map[string]bool{}
	for _, x := range res {
		r.results++
		if _, known := sl.ids[x.ID]; !known {
			r.unknownR++
			continue
		}
		count[x.ID]++
		if count[x.ID] == 2 {
			r.duplicates++
		}
		if x.OK() {
			r.resultsOK++
			ok[x.ID] = true
		}
	}
	for id, job := range sl.ids {
		if job < 0 || jobs.deadlines[job] > end {
			continue // the filler, or a job due after the run: not judged
		}
		r.judged[job]++
		if t, got := at[id]; !got || !ok[id] || t > jobs.deadlines[job] {
			r.missed[job]++
		}
	}
}
