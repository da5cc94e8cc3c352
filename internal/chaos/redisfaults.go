package main

import (
	"context"
	"time"
)

// redisRestarts: two replicas of a Redis transport (tc) under load on a
// redis-server with appendonly yes and appendfsync always; the server is
// killed (SIGKILL) and started again on the same port and data dir,
// restarts times, each gone for gone. Nothing may be lost or answered twice,
// and the replicas must ride it out (no exit).
func redisRestarts(ctx context.Context, e *env, name string, tc transportCase, restarts int, gone time.Duration) *verdict {
	s, v := open(ctx, e, name, tc, brokerTweak{persist: true}, gatewayFaults{latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond})
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
	n := 3000
	if restarts > 1 {
		n = 5000 // load through every restart (1.5 s apart)
	}
	if err := s.b.send(ctx, s.goodMessages("r", n, 10*time.Minute)); err != nil {
		v.fail("send: %v", err)
		return v
	}
	var answeredBefore []int
	var last time.Time
	for i := 0; i < restarts && ctx.Err() == nil; i++ {
		sleep(ctx, 1500*time.Millisecond)
		answeredBefore = append(answeredBefore, s.l.tally().answered)
		if err := s.r.restartRedis(gone); err != nil {
			v.fail("%v", err)
			return v
		}
		last = time.Now()
	}
	done := s.waitComplete(ctx, 60*time.Second)
	v.extra["recovery_s"] = s.l.recoveredAfter(last, time.Now())
	if !done {
		v.fail("not every request answered 60 s after the last restart")
	}
	s.quiet(ctx, 3*time.Second, 6*time.Second)
	s.checkCrashes()
	for _, p := range reps {
		if _, err := p.term(30 * time.Second); err != nil {
			v.fail("%v", err)
		}
	}
	v.t = s.l.tally()
	v.extra["restarts"] = float64(restarts)
	v.extra["gone_seconds"] = gone.Seconds()
	if len(answeredBefore) > 0 {
		v.extra["answered_at_first_restart"] = float64(answeredBefore[0])
	}
	v.extra["gateway_calls"] = float64(s.gw.totalCalls())
	v.judge(0)
	s.l.codeFigures(v.extra)
	return v
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
