package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// ipReaction reads the batch's occupancy of the pool: a fall of at least
// max(2, 10 %) after a burst starts is the reaction; the return to the
// pre-burst level after the burst ends is the recovery; a burst without a
// fall scores a whole phase.
func TestIPReaction(t *testing.T) {
	ms := time.Millisecond
	bursts := [][2]time.Duration{{1000 * ms, 1000*ms + ipPhase}, {20000 * ms, 20000*ms + ipPhase}}
	var samples []ipSample
	for at := time.Duration(0); at < 40*time.Second; at += 50 * ms {
		occ := 20.0
		switch {
		case at >= 1300*ms && at < bursts[0][1]+400*ms:
			occ = 12 // fell 300 ms into the first burst, back 400 ms after it
		case at >= 1100*ms && at < 1300*ms:
			occ = 19 // a one-request dip is not a fall
		}
		samples = append(samples, ipSample{at: at, limit: occ})
	}
	reaction, recovery := ipReaction(samples, bursts, ipPhase)
	if len(reaction) != 2 || reaction[0] != 300 || reaction[1] != float64(ipPhase.Milliseconds()) {
		t.Fatalf("reaction %v, want [300 %d]", reaction, ipPhase.Milliseconds())
	}
	if len(recovery) != 2 || recovery[0] != 400 || recovery[1] != 0 {
		t.Fatalf("recovery %v, want [400 0]", recovery)
	}
}

// ipJudge counts a job's request as missed when its result is absent, not
// ok, or late, and counts duplicates and results nobody asked for.
func TestIPJudge(t *testing.T) {
	jobs := ipJobs{unit: 2, deadlines: [3]time.Duration{time.Second, 2 * time.Second, time.Hour}}
	sl := &ipSluice{ids: map[string]int{"j0-0": 0, "j0-1": 0, "j1-0": 1, "j1-1": 1, "j2-0": 2, "f-0": -1}}
	res := []*wire.Result{
		{ID: "j0-0", StatusCode: 200},
		{ID: "j0-0", StatusCode: 200}, // duplicate
		{ID: "j0-1", StatusCode: 200}, // late (below)
		{ID: "j1-0", ErrorCode: wire.CodeDeadlineExceeded},
		{ID: "f-0", StatusCode: 200},
		{ID: "stranger", StatusCode: 200},
		// j1-1 never answered; j2-0 is due after the run: not judged
	}
	at := map[string]time.Duration{"j0-0": 500 * time.Millisecond, "j0-1": 1500 * time.Millisecond, "j1-0": time.Second, "f-0": time.Second, "stranger": time.Second}
	var r ipRun
	ipJudge(&r, sl, res, at, jobs, 10*time.Second)
	if r.judged != [3]int{2, 2, 0} || r.missed != [3]int{1, 2, 0} {
		t.Fatalf("judged %v missed %v, want [2 2 0] and [1 2 0]", r.judged, r.missed)
	}
	if r.duplicates != 1 || r.unknownR != 1 || r.results != 6 || r.resultsOK != 4 {
		t.Fatalf("duplicates %d unknown %d results %d ok %d, want 1 1 6 4", r.duplicates, r.unknownR, r.results, r.resultsOK)
	}
}

// The frontier's ideal dispatchers behave as the model says they must on
// the stress pool: the max-goodput engine point (every seat filled, the
// engine preempting for arrivals) has the highest goodput of the policies
// that keep seats from the batch; a larger reserve buys a lower p99 with less goodput; a
// static limit that does not react within a burst queues interactive
// requests far beyond a reactive one at about the same goodput.
func TestFrontierOrdering(t *testing.T) {
	prof := ipProfiles()[0]
	_, res, err := frontierReplays(ipPools()[0], prof, ipSeed)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]figures{}
	for _, r := range res {
		by[r.policy] = r.f
	}
	oracle, r8, r1, static := by[frontierEngine], by["reactive-r8"], by["reactive-r1"], by["phase-i32-b16"]
	if oracle == nil || r8 == nil || r1 == nil || static == nil {
		t.Fatalf("policies missing: %v", by)
	}
	for name, f := range by {
		// a policy that keeps seats from the batch cannot beat the engine
		// point's goodput (an uncapped static one, the ungated batch, can:
		// it makes the arrivals wait)
		if strings.HasPrefix(name, "static-") || strings.HasPrefix(name, "phase-") {
			continue
		}
		if f["batch_goodput_share"] > oracle["batch_goodput_share"]+0.01 {
			t.Errorf("%s goodput %.2f above the oracle's %.2f", name, f["batch_goodput_share"], oracle["batch_goodput_share"])
		}
	}
	if r8["batch_goodput_share"] >= r1["batch_goodput_share"] || r8["ttft_p99_ratio"] >= r1["ttft_p99_ratio"] {
		t.Errorf("reserve 8 vs 1: goodput %.2f vs %.2f, p99 %.2f vs %.2f; want both lower with the larger reserve",
			r8["batch_goodput_share"], r1["batch_goodput_share"], r8["ttft_p99_ratio"], r1["ttft_p99_ratio"])
	}
	if static["ttft_p99_ratio"] < 3*r1["ttft_p99_ratio"] {
		t.Errorf("static burst limit p99 %.2f, reactive %.2f: want the static one far worse", static["ttft_p99_ratio"], r1["ttft_p99_ratio"])
	}
}

// The pooled p99 ratio is the p99 of every burst's arrivals together over
// the floor's; its bootstrap interval (whole bursts resampled) holds the
// ratio and widens when the bursts disagree.
func TestPooledP99Ratio(t *testing.T) {
	floor := burstSample{}
	arm := burstSample{}
	for b := range 30 {
		var f, a []float64
		for i := range 40 {
			f = append(f, 100+float64(i))
			a = append(a, 150+float64(i)+float64(b%3)*20)
		}
		floor, arm = append(floor, f), append(arm, a)
	}
	ratio, lo, hi := pooledP99Ratio(arm, floor, 500, 1)
	// floor p99 (nearest rank of 1,200): 139; the arm's: 228, from the
	// bursts with b%3 = 2 (their top value 229 fills only the last 10)
	if want := 228.0 / 139; ratio < want-1e-9 || ratio > want+1e-9 {
		t.Fatalf("ratio %v, want %v", ratio, want)
	}
	if !(lo <= ratio && ratio <= hi) || hi-lo <= 0 {
		t.Fatalf("interval [%v, %v] does not hold %v, or is empty", lo, hi, ratio)
	}
	// one identical burst repeated: no spread at all
	same := burstSample{arm[0], arm[0], arm[0]}
	r2, lo2, hi2 := pooledP99Ratio(same, burstSample{floor[0]}, 200, 1)
	if lo2 != r2 || hi2 != r2 {
		t.Fatalf("identical bursts: [%v, %v] around %v, want no spread", lo2, hi2, r2)
	}
	if r, _, _ := pooledP99Ratio(nil, floor, 10, 1); r == r { // NaN
		t.Fatalf("no arm arrivals: ratio %v, want NaN", r)
	}
}

// A peer's p99 at sluice's goodput is interpolated along its sweep, taken
// from the nearest point within the tolerance beyond its ends, and absent
// when the sweep does not come near.
func TestP99AtGoodput(t *testing.T) {
	sweep := []peerPoint{{0.9, 20}, {0.5, 2}, {0.7, 6}}
	for _, tc := range []struct {
		g, want float64
		ok      bool
	}{
		{0.6, 4, true},   // between 0.5 and 0.7
		{0.8, 13, true},  // between 0.7 and 0.9
		{0.92, 20, true}, // beyond the sweep, within 0.03 of its end
		{0.48, 2, true},  // below it, within 0.03
		{0.95, 0, false}, // too far
		{0.3, 0, false},  // too far
		{0.7, 6, true},   // on a point
	} {
		got, ok := p99AtGoodput(sweep, tc.g, 0.03)
		if ok != tc.ok || (ok && (got < tc.want-1e-9 || got > tc.want+1e-9)) {
			t.Errorf("at goodput %v: %v %v, want %v %v", tc.g, got, ok, tc.want, tc.ok)
		}
	}
	if (peerPoint{0.8, 1.2}).dominates(peerPoint{0.8, 1.3}) || !(peerPoint{0.81, 1.2}).dominates(peerPoint{0.8, 1.3}) {
		t.Fatal("dominates wants strictly more goodput and a lower p99")
	}
}
