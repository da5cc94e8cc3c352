package main

import (
	"context"
	"math/rand/v2"
	"time"
)

// kill9Size sizes the kill -9 case of one broker.
type kill9Size struct {
	requests               int
	concurrency            int // per replica
	latencyMin, latencyMax time.Duration
	settle                 time.Duration // longest wait for the last answers after the last kill
	quiet                  time.Duration // no new result this long ends the watch for late duplicates
	// trickle > 0 sends the requests trickle at a time every 500 ms while
	// the kills go on, instead of all at once (a small backlog: the Pub/Sub
	// emulator leases whatever is waiting to a subscriber in chunks of 100,
	// whatever its flow control says, and strands them when it dies).
	trickle int
}

// kill9Kills is how many kill -9 the case makes.
const kill9Kills = 20

// kill9Fault: two replicas under load; 20 times, one of them (at random)
// is killed with SIGKILL at a random moment and started again at once.
// Every request must end with one result; on a transport that may repeat
// a result after a crash, duplicates may not exceed the requests in
// flight at the kills (inflight_at_kill: ids the gateway had been called
// for and whose result had not been read when the kill came, summed over
// the kills — an upper bound of what the killed replica held).
func kill9Fault(tc transportCase) func(ctx context.Context, e *env) *verdict {
	return kill9Run(tc, false)
}

// runKill9PubSubBare is kill9-gcp-pubsub with the bare client (bare.go) in
// place of sluice: the control that tells the emulator's part.
func runKill9PubSubBare(ctx context.Context, e *env) *verdict {
	for _, tc := range transportCases() {
		if tc.name == "gcp-pubsub" {
			return kill9Run(tc, true)(ctx, e)
		}
	}
	v := &verdict{extra: figures{}}
	v.fail("no gcp-pubsub transport case")
	return v
}

func kill9Run(tc transportCase, bare bool) func(ctx context.Context, e *env) *verdict {
	return func(ctx context.Context, e *env) *verdict {
		sz := tc.kill9
		s, v := open(ctx, e, "kill9-"+tc.name, tc, brokerTweak{}, gatewayFaults{latencyMin: sz.latencyMin, latencyMax: sz.latencyMax})
		if s == nil {
			return v
		}
		defer s.close()
		cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, sz.concurrency))
		if err != nil {
			v.fail("config: %v", err)
			return v
		}
		if bare {
			cfgPath = bareSpec(s.b.(*pubSub), 2*sz.concurrency+16)
		}
		reps := make([]*replica, 2)
		for i := range reps {
			if reps[i], err = s.r.startReplica("replica", cfgPath); err == nil {
				err = reps[i].waitReady(ctx, 60*time.Second)
			}
			if err != nil {
				v.fail("%v", err)
				return v
			}
		}
		msgs := s.goodMessages("k", sz.requests, 15*time.Minute)
		sendErr := make(chan error, 1)
		if sz.trickle == 0 {
			sendErr <- s.b.send(ctx, msgs)
		} else {
			go func() {
				for i := 0; i < len(msgs); i += sz.trickle {
					if err := s.b.send(ctx, msgs[i:min(i+sz.trickle, len(msgs))]); err != nil {
						sendErr <- err
						return
					}
					sleep(ctx, 500*time.Millisecond)
				}
				sendErr <- nil
			}()
		}
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
		inflight, killedAt := 0, time.Time{}
		for k := 0; k < kill9Kills && ctx.Err() == nil; k++ {
			sleep(ctx, time.Duration(300+rng.IntN(600))*time.Millisecond)
			i := rng.IntN(2)
			killedAt = time.Now()
			snap := s.gw.snapshot()
			for id := range snap {
				if !s.l.answeredBy(id, killedAt) {
					inflight++
				}
			}
			for _, id := range s.gw.inflightIDs() {
				if _, done := snap[id]; !done {
					inflight++ // first call still running
				}
			}
			reps[i].kill()
			if reps[i], err = s.r.startReplica("replica", cfgPath); err != nil {
				v.fail("restart: %v", err)
				return v
			}
		}
		if err := <-sendErr; err != nil {
			v.fail("send: %v", err)
			return v
		}
		answeredAtLastKill := s.l.tally().answered
		done := s.waitComplete(ctx, sz.settle)
		v.extra["recovery_seconds"] = time.Since(killedAt).Seconds()
		if !done {
			v.fail("not every request answered %s after the last kill", sz.settle)
		}
		q := sz.quiet
		if q == 0 {
			q = 3 * time.Second
		}
		s.quiet(ctx, q, 2*q)
		s.checkCrashes()
		for _, p := range reps {
			if bare {
				p.kill() // the bare client has no SIGTERM handling
				continue
			}
			if _, err := p.term(30 * time.Second); err != nil {
				v.fail("%v", err)
			}
		}
		v.t = s.l.tally()
		v.extra["kills"] = kill9Kills
		v.extra["answered_at_last_kill"] = float64(answeredAtLastKill)
		v.extra["gateway_calls"] = float64(s.gw.totalCalls())
		v.extra["inflight_at_kill"] = float64(inflight)
		allowed := 0
		if tc.dupOnCrash {
			allowed = inflight
		}
		v.judge(allowed)
		s.l.codeFigures(v.extra)
		return v
	}
}
