package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// runEmulatorRestart: the Pub/Sub emulator is killed and started again on
// its port while one replica works. The emulator keeps no state: topics,
// subscriptions and every message it held are gone, so the harness
// creates the topics and subscriptions again (as an operator's Terraform
// would). What the emulator dropped is the broker's loss, not sluice's,
// so the case is built to tell them apart:
//
//   - batch a (100) is sent and fully answered before the restart;
//   - batch b (100) is sent against a slow gateway (1–2 s, 8 workers), so
//     at the restart some of it is in sluice (its gateway call started:
//     inflight_at_restart) and the rest still in the emulator
//     (waiting_at_restart);
//   - batch c (100) is sent after the restart, once the topics exist again.
//
// sluice_lost counts lost ids of a, c and b's in-flight part: sluice had
// them, or had the broker back, and must answer them, and every lost id of
// b the proxy saw delivered to sluice before the restart. broker_lost
// counts lost ids of b that the proxy saw delivered to no subscriber
// before the emulator, which held them, was killed. Only sluice_lost fails
// the case; lost= is the sum. An ack sent before an accepted publish of
// the request's result fails it too (acked_without_result).
//
// The replica reaches the emulator through the recording proxy, which notes
// every Publish call it makes: a lost id whose result the emulator accepted
// (to the result topic) was dropped by the broker, not by sluice — it died
// with the old emulator, or reached the new result topic before its
// subscription was created again (Pub/Sub keeps nothing for a topic with no
// subscription). Those are counted in broker_lost too (result_dropped_by_broker).
func runEmulatorRestart(ctx context.Context, e *env) *verdict {
	var tc transportCase
	for _, c := range transportCases() {
		if c.name == "gcp-pubsub" {
			tc = c
		}
	}
	s, v := open(ctx, e, "pubsub-emulator-restart", tc, brokerTweak{traced: true}, gatewayFaults{latencyMin: time.Second, latencyMax: 2 * time.Second})
	if s == nil {
		return v
	}
	defer s.close()
	ps := s.b.(*pubSub)
	cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, 8))
	if err != nil {
		v.fail("config: %v", err)
		return v
	}
	p, err := s.r.startReady(ctx, cfgPath)
	if err != nil {
		v.fail("%v", err)
		return v
	}
	a := s.goodMessages("ea", 100, 10*time.Minute)
	if err := s.send(ctx, a); err != nil {
		v.fail("send a: %v", err)
		return v
	}
	if !s.waitComplete(ctx, 90*time.Second) {
		v.fail("batch a not answered before the restart")
	}
	b := s.goodMessages("eb", 100, 10*time.Minute)
	if err := s.send(ctx, b); err != nil {
		v.fail("send b: %v", err)
		return v
	}
	sleep(ctx, 3*time.Second)
	restartAt := time.Now()
	called := s.gw.snapshot()
	for _, id := range s.gw.inflightIDs() {
		called[id] = nil
	}
	inSluice := map[string]bool{}
	waiting := 0
	for _, m := range b {
		if _, ok := called[m.id]; ok || s.l.answeredBy(m.id, restartAt) {
			inSluice[m.id] = true
		} else {
			waiting++
		}
	}
	if err := s.r.restartEmulator(); err != nil {
		v.fail("%v", err)
		return v
	}
	if err := ps.createTopics(ctx); err != nil {
		v.fail("recreate topics: %v", err)
		return v
	}
	back := time.Since(restartAt)
	c := s.goodMessages("ec", 100, 10*time.Minute)
	if err := s.send(ctx, c); err != nil {
		v.fail("send c: %v", err)
		return v
	}
	s.waitComplete(ctx, 60*time.Second)
	s.quiet(ctx, 5*time.Second, 10*time.Second)
	s.checkCrashes()
	if _, err := p.term(30 * time.Second); err != nil {
		v.fail("%v", err)
	}
	// What the emulator accepted on the result topic and the reader did not
	// get is drained with a fresh client before anything is called the
	// broker's.
	s.stopRd()
	<-s.rdDone
	nres, _, err := ps.drain(ctx, "results-sub", restartAt, 90*time.Second, nil, func(msgID string, data []byte) { ps.recordResult(s.l, msgID, data) })
	if err != nil {
		v.fail("%v", err)
	}
	v.extra["drained_results"] = float64(nres)
	v.t = s.l.tally()
	h := ps.proxy.history()
	okTopics := map[string]bool{ps.name("topics", "results"): true, ps.name("topics", "dead"): true, ps.name("topics", "requests"): true}
	// Acked before an accepted publish of the result: sluice's, whatever
	// the emulator did (accountPubSub's first rule, with nothing drained).
	awr := accountPubSub(tally{}, s.l.ids(), h, nil, nil, time.Now(), okTopics, "").ackedWithoutResult
	v.extra["acked_without_result"] = float64(len(awr))
	if len(awr) > 0 {
		v.fail("%d ids acked before any accepted publish of their result (first: %s)", len(awr), firstFew(awr))
	}
	sluiceLost, brokerLost, dropped := 0, 0, 0
	for _, id := range v.t.lostIDs {
		pubs := ps.proxy.publishedTo(id, ps.name("topics", "results"))
		deliveredBefore := false
		for _, d := range h.deliveries[id] {
			deliveredBefore = deliveredBefore || d.at.Before(restartAt)
		}
		switch {
		case slices.Contains(awr, id):
			sluiceLost++
		case len(pubs) > 0:
			// Accepted, and not in the result subscription at the end.
			brokerLost++
			dropped++
			fmt.Fprintf(os.Stderr, "chaos: pubsub-emulator-restart: %s: its result was accepted by the emulator %s after the restart (the result subscription was created again %s after it); the broker dropped it\n",
				id, pubs[len(pubs)-1].Sub(restartAt).Round(time.Millisecond), ps.resultsSubAt.Sub(restartAt).Round(time.Millisecond))
		case strings.HasPrefix(id, "eb-") && !inSluice[id] && !deliveredBefore:
			// Proven the broker's: the proxy saw no delivery of it to
			// sluice before the emulator, which held it, was killed.
			brokerLost++
			fmt.Fprintf(os.Stderr, "chaos: pubsub-emulator-restart: %s: never delivered before the restart; it died with the emulator\n", id)
		default:
			sluiceLost++
			fmt.Fprintf(os.Stderr, "chaos: pubsub-emulator-restart: %s: lost by sluice (delivered before the restart: %v)\n", id, deliveredBefore)
		}
	}
	v.extra["result_dropped_by_broker"] = float64(dropped)
	if sluiceLost > 0 {
		v.fail("%d ids lost that sluice held or could have had (first: %s)", sluiceLost, firstFew(v.t.lostIDs))
	}
	if v.t.duplicated > len(inSluice) {
		v.fail("%d ids duplicated, more than the %d sluice held at the restart", v.t.duplicated, len(inSluice))
	}
	if v.t.unknown > 0 {
		v.fail("%d results for ids never sent", v.t.unknown)
	}
	if v.t.wrongCode > 0 {
		v.fail("%d ids with a result other than a 200 answer (first: %s)", v.t.wrongCode, firstFew(v.t.wrongIDs))
	}
	v.extra["wrong_code"] = float64(v.t.wrongCode)
	v.extra["unknown"] = float64(v.t.unknown)
	v.extra["inflight_at_restart"] = float64(len(inSluice))
	v.extra["waiting_at_restart"] = float64(waiting)
	v.extra["sluice_lost"] = float64(sluiceLost)
	v.extra["broker_lost"] = float64(brokerLost)
	v.extra["emulator_back_seconds"] = back.Seconds()
	s.l.codeFigures(v.extra)
	return v
}
