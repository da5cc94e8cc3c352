package main

import (
	"context"
	"time"
)

// brokerFault is one fault caused by underLoad while the replicas work:
// name, broker tweak and gateway latency, how many requests, how long to
// watch for late duplicates, and act, which causes it and returns when the
// last part of it ended (false: it failed, v says why).
type brokerFault struct {
	name  string
	tw    brokerTweak
	gf    gatewayFaults
	n     int
	quiet time.Duration
	act   func(ctx context.Context, s *session, v *verdict) (time.Time, bool)
}

// underLoad runs two replicas of tc (32 in flight each) on n requests and
// causes f while they work; then every request must be answered within
// 60 s of the fault's end, nothing may be lost or answered twice, and the
// replicas must ride it out (no exit) and stop on SIGTERM.
func underLoad(ctx context.Context, e *env, tc transportCase, f brokerFault) *verdict {
	s, v := open(ctx, e, f.name, tc, f.tw, f.gf)
	if s == nil {
		return v
	}
	defer s.close()
	cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, 32))
	if err != nil {
		v.fail("config: %v", err)
		return v
	}
	var reps []*replica
	for range 2 {
		p, err := s.r.startReady(ctx, cfgPath)
		if err != nil {
			v.fail("%v", err)
			return v
		}
		reps = append(reps, p)
	}
	if err := s.send(ctx, s.goodMessages("r", f.n, 10*time.Minute)); err != nil {
		v.fail("send: %v", err)
		return v
	}
	last, ok := f.act(ctx, s, v)
	if !ok {
		return v
	}
	done := s.waitComplete(ctx, 60*time.Second)
	v.extra["recovery_s"] = s.l.recoveredAfter(last, time.Now())
	if !done {
		v.fail("not every request answered 60 s after the fault")
	}
	s.quiet(ctx, f.quiet, 2*f.quiet)
	s.checkCrashes()
	for _, p := range reps {
		if _, err := p.term(30 * time.Second); err != nil {
			v.fail("%v", err)
		}
	}
	v.t = s.l.tally()
	v.extra["gateway_calls"] = float64(s.gw.totalCalls())
	v.judge(0)
	s.l.codeFigures(v.extra)
	return v
}

// redisRestarts: two replicas of a Redis transport (tc) under load on a
// redis-server with appendonly yes and appendfsync always; the server is
// killed (SIGKILL) and started again on the same port and data dir,
// restarts times, each gone for gone.
func redisRestarts(ctx context.Context, e *env, name string, tc transportCase, restarts int, gone time.Duration) *verdict {
	n := 3000
	if restarts > 1 {
		n = 5000 // load through every restart (1.5 s apart)
	}
	return underLoad(ctx, e, tc, brokerFault{name: name, tw: brokerTweak{persist: true},
		gf: gatewayFaults{latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond}, n: n, quiet: 3 * time.Second,
		act: func(ctx context.Context, s *session, v *verdict) (time.Time, bool) {
			var last time.Time
			for i := 0; i < restarts && ctx.Err() == nil; i++ {
				sleep(ctx, 1500*time.Millisecond)
				if i == 0 {
					v.extra["answered_at_first_restart"] = float64(s.l.tally().answered)
				}
				if err := s.r.restartRedis(gone); err != nil {
					v.fail("%v", err)
					return last, false
				}
				last = time.Now()
			}
			v.extra["restarts"] = float64(restarts)
			v.extra["gone_seconds"] = gone.Seconds()
			return last, true
		}})
}

// redisRestartAOF: five restarts, each at once (the AOF brings the data back).
func redisRestartAOF(tc transportCase) func(ctx context.Context, e *env) *verdict {
	return func(ctx context.Context, e *env) *verdict {
		return redisRestarts(ctx, e, "redis-restart-aof-"+tc.name, tc, 5, 0)
	}
}

// redisOutage: the process gone for 10 s, then back on the same port and data.
func redisOutage(tc transportCase) func(ctx context.Context, e *env) *verdict {
	return func(ctx context.Context, e *env) *verdict {
		return redisRestarts(ctx, e, "redis-outage-"+tc.name, tc, 1, 10*time.Second)
	}
}
