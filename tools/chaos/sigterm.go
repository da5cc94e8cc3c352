package main

import (
	"context"
	"time"
)

// sigtermFault: one replica with slow requests (1.5–2.5 s at the gateway)
// in flight and a backlog behind them gets SIGTERM. It must finish what is
// in flight (drain_timeout 10 s is longer than any call), start nothing
// new, hand back the rest and exit within the longest call plus a margin;
// then a new replica must answer all the rest. Checked from outside: the
// gateway's calls (none may start after the SIGTERM until the new replica
// runs; none of the requests in flight at the SIGTERM may be called again)
// and the results.
func sigtermFault(tc transportCase) func(ctx context.Context, e *env) *verdict {
	return func(ctx context.Context, e *env) *verdict {
		const latMax = 2500 * time.Millisecond
		s, v := open(ctx, e, "sigterm-"+tc.name, tc, brokerTweak{}, gatewayFaults{latencyMin: 1500 * time.Millisecond, latencyMax: latMax})
		if s == nil {
			return v
		}
		defer s.close()
		const conc = 16
		cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, conc))
		if err != nil {
			v.fail("config: %v", err)
			return v
		}
		a, err := s.r.startReplica("old", cfgPath)
		if err == nil {
			err = a.waitReady(ctx, 60*time.Second)
		}
		if err != nil {
			v.fail("%v", err)
			return v
		}
		const n = 120
		if err := s.send(ctx, s.goodMessages("t", n, 10*time.Minute)); err != nil {
			v.fail("send: %v", err)
			return v
		}
		// Let the burst fill the replica, then wait for calls in flight.
		sleep(ctx, 3*time.Second)
		for end := time.Now().Add(10 * time.Second); len(s.gw.inflightIDs()) < conc && time.Now().Before(end); {
			sleep(ctx, 10*time.Millisecond)
		}
		inflight := s.gw.inflightIDs()
		termAt := time.Now()
		took, err := a.term(30 * time.Second)
		if err != nil {
			v.fail("%v", err)
		}
		exitedAt := time.Now()
		limit := latMax + 2*time.Second
		if took > limit {
			v.fail("the old replica took %s to exit; its calls in flight end within %s", took, latMax)
		}
		sleep(ctx, 500*time.Millisecond) // results written before the exit are read by now
		drained, rerun := 0, 0
		for _, id := range inflight {
			if s.l.answeredBy(id, exitedAt.Add(500*time.Millisecond)) {
				drained++
			}
		}
		callsAfter := 0
		for _, as := range s.gw.snapshot() {
			for _, c := range as {
				if c.start.After(termAt) {
					callsAfter++
				}
			}
		}
		answeredByOld := s.l.tally().answered
		if drained != len(inflight) {
			v.fail("%d of the %d requests in flight at SIGTERM were not answered by the old replica", len(inflight)-drained, len(inflight))
		}
		if callsAfter > 0 {
			v.fail("%d gateway calls started after SIGTERM, before the new replica", callsAfter)
		}
		b, err := s.r.startReplica("new", cfgPath)
		if err != nil {
			v.fail("%v", err)
			return v
		}
		newStart := time.Now()
		if !s.waitComplete(ctx, 120*time.Second) {
			v.fail("the new replica did not answer the rest within 120 s")
		}
		newTook := time.Since(newStart)
		s.quiet(ctx, 2*time.Second, 4*time.Second)
		snap := s.gw.snapshot()
		for _, id := range inflight {
			if len(snap[id]) > 1 {
				rerun++
			}
		}
		if rerun > 0 {
			v.fail("%d requests in flight at SIGTERM were called again", rerun)
		}
		s.checkCrashes()
		if _, err := b.term(30 * time.Second); err != nil {
			v.fail("%v", err)
		}
		v.t = s.l.tally()
		v.judge(0)
		v.extra["inflight_at_term"] = float64(len(inflight))
		v.extra["drained"] = float64(drained)
		v.extra["old_exit_seconds"] = took.Seconds()
		v.extra["answered_by_old"] = float64(answeredByOld)
		v.extra["calls_after_term"] = float64(callsAfter)
		v.extra["inflight_called_again"] = float64(rerun)
		v.extra["new_replica_seconds"] = newTook.Seconds()
		s.l.codeFigures(v.extra)
		return v
	}
}
