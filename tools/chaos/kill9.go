package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
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
	// stall > 0: on the traced Pub/Sub broker, stop waiting once at least
	// stallMin after the last kill nothing has moved for stall (no gateway
	// call running, no result), rather than waiting out settle: what is
	// missing then is drained and classified (below).
	stall, stallMin time.Duration
}

// kill9Kills is how many kill -9 the case makes.
const kill9Kills = 20

// kill9Fault: two replicas under load; 20 times, one of them (at random)
// is killed with SIGKILL at a random moment and started again at once.
// Every request must end with one result; on a transport that may repeat
// a result after a crash, duplicates may not exceed the requests in
// flight at the kills (inflight_at_kill: distinct ids the gateway had been
// called for and whose result had not been read 2 s before a kill came —
// an upper bound of what the killed replicas held unacked).
//
// On the traced Pub/Sub broker (the emulator behind the recording proxy),
// lost= is every request unanswered at the end, and each is classified
// (accountPubSub): the replicas are stopped, the result and request
// subscriptions drained with a fresh client, and what is still missing is
// the broker's only when that is proven — found in the request
// subscription by the drain, never acked, and never delivered or last
// delivered to a replica the harness killed (broker_held), or its result
// accepted by the emulator (result_dropped_by_broker). Anything else is
// sluice's and fails the case, and so does any ack sent before an accepted
// publish of the request's result (acked_without_result), answered or not.
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
		s, v := open(ctx, e, "kill9-"+tc.name, tc, brokerTweak{traced: true}, gatewayFaults{latencyMin: sz.latencyMin, latencyMax: sz.latencyMax})
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
			s.l.mu.Lock()
			s.l.callsUnseen = true // the bare client answers without the gateway
			s.l.mu.Unlock()
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
		caseStart := time.Now().Add(-time.Second) // the drain seeks back to here
		msgs := s.goodMessages("k", sz.requests, 15*time.Minute)
		sendErr := make(chan error, 1)
		if sz.trickle == 0 {
			sendErr <- s.send(ctx, msgs)
		} else {
			go func() {
				for i := 0; i < len(msgs); i += sz.trickle {
					if err := s.send(ctx, msgs[i:min(i+sz.trickle, len(msgs))]); err != nil {
						sendErr <- err
						return
					}
					sleep(ctx, 500*time.Millisecond)
				}
				sendErr <- nil
			}()
		}
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
		inflight, killedAt := map[string]bool{}, time.Time{}
		for k := 0; k < kill9Kills && ctx.Err() == nil; k++ {
			sleep(ctx, time.Duration(300+rng.IntN(600))*time.Millisecond)
			i := rng.IntN(2)
			killedAt = time.Now()
			// A result read shortly before the kill may still wait for
			// its ack: 2 s of margin.
			for id := range s.gw.snapshot() {
				if s.l.sentID(id) && !s.l.answeredBy(id, killedAt.Add(-2*time.Second)) {
					inflight[id] = true
				}
			}
			for _, id := range s.gw.inflightIDs() {
				if s.l.sentID(id) {
					inflight[id] = true // first call still running
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
		ps, tracing := s.b.(*pubSub)
		tracing = tracing && ps.traced()
		var done bool
		if tracing && sz.stall > 0 {
			done = s.waitStalled(ctx, killedAt, sz.stallMin, sz.settle, sz.stall)
		} else {
			done = s.waitComplete(ctx, sz.settle)
		}
		v.extra["recovery_s"] = s.l.recoveredAfter(killedAt, time.Now())
		if !done && !tracing {
			v.fail("not every request answered %s after the last kill", sz.settle)
		}
		q := sz.quiet
		if q == 0 {
			q = 3 * time.Second
		}
		s.quiet(ctx, q, 2*q)
		until := time.Now() // the end of the watch
		s.checkCrashes()
		killed := s.r.killedPIDs() // before the survivors are stopped
		for _, p := range reps {
			if bare {
				p.kill() // the bare client has no SIGTERM handling
				continue
			}
			if _, err := p.term(30 * time.Second); err != nil {
				v.fail("%v", err)
			}
		}
		allowed := 0
		if tc.dupOnCrash {
			allowed = len(inflight)
		}
		if bare {
			// The control calls no gateway: what it had in flight at the
			// kills is not known, its duplicates are only shown.
			allowed = sz.requests
		}
		if tracing {
			pubSubAccounting(ctx, s, ps, v, caseStart, until, killed, allowed)
		} else {
			v.t = s.l.tally()
			v.judge(allowed)
		}
		v.extra["kills"] = kill9Kills
		v.extra["answered_at_last_kill"] = float64(answeredAtLastKill)
		v.extra["gateway_calls"] = float64(s.gw.totalCalls())
		v.extra["inflight_at_kill"] = float64(len(inflight))
		if tc.dupOnCrash && !bare {
			outside := 0
			for _, id := range v.t.dupIDs {
				if !inflight[id] {
					outside++
				}
			}
			v.extra["dup_not_inflight"] = float64(outside)
			if outside > 0 {
				v.fail("%d duplicated ids were not in flight at any kill", outside)
			}
		}
		s.l.codeFigures(v.extra)
		return v
	}
}

// pubSubAccounting ends a traced Pub/Sub run once its replicas are
// stopped: it stops the result reader, drains the result subscription into
// the ledger and the request subscription into a set, tallies, classifies
// every unanswered id from the proxy's history (accountPubSub), puts the
// figures on v and judges it (dupAllowed duplicates allowed), failing it
// for what is sluice's; the ids of each class are named on stderr.
func pubSubAccounting(ctx context.Context, s *session, ps *pubSub, v *verdict, since, until time.Time, killed map[int]bool, dupAllowed int) {
	s.stopRd()
	<-s.rdDone
	nres, _, err := ps.drain(ctx, "results-sub", since, 90*time.Second, nil, func(msgID string, data []byte) { ps.recordResult(s.l, msgID, data) })
	if err != nil {
		v.fail("%v", err)
	}
	// Drain the requests until every unanswered id no subscriber acked is
	// found (or 3 minutes).
	acked := ps.proxy.history().acks
	var unanswered []string
	for _, id := range s.l.tally().lostIDs {
		if !slices.ContainsFunc(acked[id], func(c ackCall) bool { return c.deadline < 0 }) {
			unanswered = append(unanswered, id)
		}
	}
	drained, drainedAnswered := map[string]bool{}, 0
	missing := func() bool {
		for _, id := range unanswered {
			if !drained[id] {
				return true
			}
		}
		return false
	}
	drainStart := time.Now()
	nreq, seeks, err := ps.drain(ctx, "requests-sub", since, 3*time.Minute, missing, func(_ string, data []byte) {
		if id := requestID(data); id != "" {
			drained[id] = true
		}
	})
	if err != nil {
		v.fail("%v", err)
	}
	v.extra["drain_seconds"] = time.Since(drainStart).Seconds()
	v.extra["drain_seeks"] = float64(seeks)
	v.t = s.l.tally()
	for id := range drained {
		if s.l.answeredBy(id, time.Now().Add(time.Hour)) {
			drainedAnswered++
		}
	}
	h := ps.proxy.history()
	okTopics := map[string]bool{ps.name("topics", "results"): true, ps.name("topics", "dead"): true, ps.name("topics", "requests"): true}
	a := accountPubSub(v.t, s.l.ids(), h, killed, drained, until, okTopics, ps.name("topics", "results"))
	a.apply(v, h)
	v.judgeExcusing(dupAllowed, a.excused(), "the broker's own: held in the subscription (drained), or a result it accepted")
	v.extra["drained_results"] = float64(nres)
	v.extra["drained_requests"] = float64(nreq)
	v.extra["drained_answered"] = float64(drainedAnswered)
	v.extra["broker_held_never_delivered"] = float64(h.neverDelivered(a.brokerHeld))
	v.extra["broker_held_called"] = float64(heldCalled(s.gw, a.brokerHeld))
	for _, id := range v.t.lostIDs {
		fmt.Fprintf(os.Stderr, "chaos: %s: unanswered %s: %s\n", s.r.name, id, h.describe(id, since, killed, drained[id]))
	}
	for _, c := range []struct {
		what string
		ids  []string
	}{
		{"acked by a subscriber before an accepted publish of its result", a.ackedWithoutResult},
		{"lost by sluice", a.sluiceLost},
		{"acked by nobody and not in the subscription", a.vanished},
		{"held by the broker (found by the drain; never delivered, or last to a killed replica)", a.brokerHeld},
		{"held by the broker more than 10 s past its last lease", a.heldPastLease},
		{"result accepted by the emulator, never delivered", a.resultDropped},
	} {
		if len(c.ids) > 0 {
			fmt.Fprintf(os.Stderr, "chaos: %s: %d %s: %s\n", s.r.name, len(c.ids), c.what, strings.Join(c.ids, ","))
		}
	}
}

// heldCalled counts the ids of ids the gateway had been called for: a
// killed replica had them in hand.
func heldCalled(gw *gateway, ids []string) int {
	called := gw.snapshot()
	for _, id := range gw.inflightIDs() {
		called[id] = nil
	}
	n := 0
	for _, id := range ids {
		if _, ok := called[id]; ok {
			n++
		}
	}
	return n
}
