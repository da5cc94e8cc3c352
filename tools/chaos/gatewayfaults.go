package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// The retry schedule the gateway-faults case configures and checks: the
// documented policy (README, retry.*): the delay before retry k+1 is
// base×2^k capped at max, spread by ±jitter; a longer Retry-After wins.
const (
	gfBase       = 200 * time.Millisecond
	gfMax        = 2 * time.Second
	gfJitter     = 0.2
	gfRetryAfter = 1 // seconds, on every 429
	// gfEarly and gfLate are the tolerances of the check: a retry may come
	// gfEarly before its earliest time (the gateway notes a call's end after
	// the last byte, sluice may see the failure a little earlier: a reset,
	// a timeout) and gfLate after its latest (the sorted set's claim loop,
	// woken by the retry's due time, and this busy 2-core machine).
	gfEarly = 100 * time.Millisecond
	gfLate  = 750 * time.Millisecond
)

// runGatewayFaults: one sorted-set replica against a gateway answering 30%
// of calls with 429 (Retry-After 1 s), 503, a connection reset or a 200
// whose body stalls half way (sluice's request_timeout of 1 s ends those;
// a timeout that is not the deadline is retryable). Every request must get
// exactly one result, before its deadline (30 s; checked when the result
// is read, with 1 s for reading), and each retry must come when the
// schedule says, from the gateway's timestamps.
func runGatewayFaults(ctx context.Context, e *env) *verdict {
	tc := transportCases()[0]
	s, v := open(ctx, e, "gateway-faults", tc, brokerTweak{}, gatewayFaults{
		latencyMin: 20 * time.Millisecond, latencyMax: 80 * time.Millisecond,
		rate429: 0.075, retryAfter: gfRetryAfter, rate5xx: 0.075, rateReset: 0.075, rateStall: 0.075})
	if s == nil {
		return v
	}
	defer s.close()
	// As many workers as requests: a retry that falls due is claimed at
	// once, not queued behind others of the same deadline (earliest deadline
	// first), so the gap measures the schedule.
	const n = 400
	cfg := baseConfig(s.b, s.gw.URL, n)
	cfg["request_timeout"] = "1s"
	cfg["retry"] = map[string]any{"base": gfBase.String(), "max": gfMax.String(), "jitter": gfJitter}
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
	const deadline = 30 * time.Second
	if err := s.send(ctx, s.goodMessages("gf", n, deadline)); err != nil {
		v.fail("send: %v", err)
		return v
	}
	if !s.waitComplete(ctx, deadline+10*time.Second) {
		v.fail("not every request answered within its deadline + 10 s")
	}
	s.quiet(ctx, 2*time.Second, 4*time.Second)
	s.checkCrashes()
	if _, err := p.term(30 * time.Second); err != nil {
		v.fail("%v", err)
	}
	v.t = s.l.tally()
	v.judge(0)

	// Results after their deadline.
	late := s.l.lateResults(time.Second)
	terminal := 0
	s.l.mu.Lock()
	for code, c := range s.l.codes {
		if code != "ok" {
			terminal += c
		}
	}
	s.l.mu.Unlock()
	if late > 0 {
		v.fail("%d results read more than 1 s after their request's deadline", late)
	}

	// The schedule, from the gateway's timestamps.
	sched := checkSchedule(s.gw.snapshot())
	if sched.violations > 0 {
		v.fail("%d of %d retries off the schedule (first: %s)", sched.violations, sched.retries, sched.first)
	}
	v.extra["after_deadline"] = float64(late)
	v.extra["terminal_errors"] = float64(terminal)
	v.extra["gateway_calls"] = float64(s.gw.totalCalls())
	v.extra["retries_checked"] = float64(sched.retries)
	v.extra["schedule_violations"] = float64(sched.violations)
	for o, c := range sched.byOutcome {
		v.extra["violations_after_"+o] = float64(c)
	}
	v.extra["max_early_ms"] = sched.maxEarly.Seconds() * 1000
	v.extra["max_late_ms"] = sched.maxLate.Seconds() * 1000
	v.extra["tolerance_early_ms"] = float64(gfEarly.Milliseconds())
	v.extra["tolerance_late_ms"] = float64(gfLate.Milliseconds())
	s.l.codeFigures(v.extra)
	return v
}

// schedule is what checkSchedule found.
type schedule struct {
	retries, violations int
	first               string
	maxEarly, maxLate   time.Duration  // furthest outside [lo, hi], before tolerance
	byOutcome           map[string]int // violations by the outcome of the call before the retry
}

// checkSchedule checks every gap between two calls of one id against the
// policy: the k-th retry (k from 0) comes between max(base×2^k capped,
// ×(1−jitter), Retry-After) and max(…×(1+jitter), Retry-After) after the
// previous call ended, within the tolerances.
func checkSchedule(calls map[string][]attempt) schedule {
	sc := schedule{byOutcome: map[string]int{}}
	ids := make([]string, 0, len(calls))
	for id := range calls {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		as := calls[id]
		sort.Slice(as, func(i, j int) bool { return as[i].start.Before(as[j].start) })
		for k := 1; k < len(as); k++ {
			prev := as[k-1]
			d := float64(gfBase) * math.Pow(2, float64(k-1))
			d = math.Min(d, float64(gfMax))
			lo, hi := time.Duration(d*(1-gfJitter)), time.Duration(d*(1+gfJitter))
			if strings.HasPrefix(prev.outcome, "429") {
				ra := time.Duration(gfRetryAfter) * time.Second
				lo, hi = max(lo, ra), max(hi, ra)
			}
			gap := as[k].start.Sub(prev.end)
			sc.retries++
			if early := lo - gap; early > sc.maxEarly {
				sc.maxEarly = early
			}
			if lateBy := gap - hi; lateBy > sc.maxLate {
				sc.maxLate = lateBy
			}
			if gap < lo-gfEarly || gap > hi+gfLate {
				sc.violations++
				sc.byOutcome[prev.outcome]++
				if sc.first == "" {
					sc.first = fmt.Sprintf("%s retry %d after %s: gap %s, want [%s,%s]", id, k, prev.outcome,
						gap.Round(time.Millisecond), lo.Round(time.Millisecond), hi.Round(time.Millisecond))
				}
			}
		}
	}
	return sc
}
