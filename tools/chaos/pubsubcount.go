package main

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// psHistory is what the recording proxy saw of the subscribers' traffic
// (pubSubProxy.history), per request id.
type psHistory struct {
	deliveries map[string][]psDelivery // in order
	acks       map[string][]ackCall    // acks and deadline changes of its deliveries, in order
	published  map[string][]publish    // Publish calls carrying the id (results, dead letters, re-queues)
	// unmappedAcks: ack ids acked or modified that no recorded delivery
	// carried (the proxy missed a delivery: the accounting cannot be trusted).
	unmappedAcks int
}

// psDelivery is one delivery of a request to a subscriber process (pid 0:
// the proxy could not tell which).
type psDelivery struct {
	at  time.Time
	pid int
}

// psAccount is what accountPubSub found. Every list is sorted.
type psAccount struct {
	// ackedWithoutResult: ids a subscriber acked with no accepted Publish
	// carrying them (a result, a dead letter, or a retry's re-queue) done
	// before the ack: a loss of sluice's wherever it happened, answered or
	// not (a later duplicate can only be luck).
	ackedWithoutResult []string
	// Every unanswered id is in exactly one of the lists below.
	//
	// sluiceLost: unanswered and sluice's: acked without a result, or
	// still held by a replica that ran to the end (its last delivery went
	// to it, or to a process the proxy could not tell, and no nack
	// followed), or gone from the subscription though no subscriber acked
	// it (vanished, a subset: the drain did not find it).
	sluiceLost []string
	vanished   []string
	// brokerHeld: unanswered, never acked, found by the drain in the
	// request subscription at the end, and either never delivered or last
	// delivered to a replica the harness killed (or handed back with a
	// nack): the broker held it and did not deliver it again in time.
	brokerHeld []string
	// heldPastLease: those of brokerHeld whose last lease (the last
	// deadline set for it, or the subscription's 10 s from its last
	// delivery) had ended more than 10 s before the watch ended.
	heldPastLease []string
	// resultDropped: unanswered though the emulator accepted a Publish of
	// its result on the result topic (the broker's loss, proven by the
	// accepted call).
	resultDropped []string
}

// accountPubSub classifies what a Pub/Sub run's ledger tally t left
// unanswered, from the proxy's history h: which replica processes the
// harness killed, which request ids the drain found still held in the
// request subscription (drained), when the watch ended (until: the
// subscribers' traffic after it — SIGTERM's nacks — does not excuse
// anything), and which topics a Publish goes to that makes an ack
// legitimate (okTopics: the result topic, the dead-letter topic, the
// request topic for a retry); resultTopic is the result topic.
func accountPubSub(t tally, sent []string, h psHistory, killed map[int]bool, drained map[string]bool, until time.Time,
	okTopics map[string]bool, resultTopic string) psAccount {
	var a psAccount
	awr := map[string]bool{}
	for _, id := range sent {
		for _, c := range h.acks[id] {
			if c.deadline >= 0 {
				continue // a deadline change, not an ack
			}
			covered := false
			for _, p := range h.published[id] {
				if p.ok && okTopics[p.topic] && !p.done.After(c.at) {
					covered = true
					break
				}
			}
			if !covered {
				awr[id] = true
				a.ackedWithoutResult = append(a.ackedWithoutResult, id)
				break
			}
		}
	}
	for _, id := range t.lostIDs {
		if awr[id] {
			a.sluiceLost = append(a.sluiceLost, id)
			continue
		}
		accepted := false
		for _, p := range h.published[id] {
			accepted = accepted || (p.ok && p.topic == resultTopic)
		}
		if accepted {
			a.resultDropped = append(a.resultDropped, id)
			continue
		}
		if !drained[id] {
			a.vanished = append(a.vanished, id)
			a.sluiceLost = append(a.sluiceLost, id)
			continue
		}
		// Who held it when the watch ended: the last delivery's process,
		// unless a nack (deadline 0) handed it back afterwards.
		holder, leaseEnd := -1, time.Time{} // -1: nobody
		ds := h.deliveries[id]
		if len(ds) > 0 {
			last := ds[len(ds)-1]
			holder, leaseEnd = last.pid, last.at.Add(10*time.Second)
			for _, c := range h.acks[id] {
				if c.at.Before(last.at) || c.at.After(until) {
					continue
				}
				if c.deadline == 0 {
					holder = -1
				}
				if c.deadline > 0 {
					leaseEnd = c.at.Add(time.Duration(c.deadline) * time.Second)
				}
			}
		}
		if holder == -1 || (holder != 0 && killed[holder]) {
			a.brokerHeld = append(a.brokerHeld, id)
			if !leaseEnd.IsZero() && until.Sub(leaseEnd) > 10*time.Second {
				a.heldPastLease = append(a.heldPastLease, id)
			}
			continue
		}
		a.sluiceLost = append(a.sluiceLost, id)
	}
	for _, l := range [][]string{a.ackedWithoutResult, a.sluiceLost, a.vanished, a.brokerHeld, a.heldPastLease, a.resultDropped} {
		sort.Strings(l)
	}
	return a
}

// excused is how many lost ids are proven the broker's own.
func (a psAccount) excused() int { return len(a.brokerHeld) + len(a.resultDropped) }

// apply puts the account's figures on v and fails it for what is sluice's:
// lost= stays every unanswered id.
func (a psAccount) apply(v *verdict, h psHistory) {
	v.extra["acked_without_result"] = float64(len(a.ackedWithoutResult))
	v.extra["sluice_lost"] = float64(len(a.sluiceLost))
	v.extra["vanished"] = float64(len(a.vanished))
	v.extra["broker_held"] = float64(len(a.brokerHeld))
	v.extra["broker_held_past_lease"] = float64(len(a.heldPastLease))
	v.extra["result_dropped_by_broker"] = float64(len(a.resultDropped))
	v.extra["unmapped_acks"] = float64(h.unmappedAcks)
	if len(a.ackedWithoutResult) > 0 {
		v.fail("%d ids acked by a subscriber before any accepted publish of their result (first: %s)",
			len(a.ackedWithoutResult), firstFew(a.ackedWithoutResult))
	}
	if len(a.vanished) > 0 {
		v.fail("%d ids unanswered, acked by no subscriber and not in the subscription at the end (first: %s)",
			len(a.vanished), firstFew(a.vanished))
	}
	if h.unmappedAcks > 0 {
		v.fail("%d ack ids acked or modified that no recorded delivery carried: the proxy missed deliveries", h.unmappedAcks)
	}
}

// neverDelivered counts the ids of ids with no recorded delivery.
func (h psHistory) neverDelivered(ids []string) int {
	n := 0
	for _, id := range ids {
		if len(h.deliveries[id]) == 0 {
			n++
		}
	}
	return n
}

// describe says what the proxy saw of id, times from t0: its deliveries
// (to which process, killed or not), acks, deadline changes and publishes.
func (h psHistory) describe(id string, t0 time.Time, killed map[int]bool, drained bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "drained=%v deliveries=[", drained)
	for i, d := range h.deliveries[id] {
		if i > 0 {
			b.WriteString(" ")
		}
		state := "running"
		switch {
		case d.pid == 0:
			state = "unknown"
		case killed[d.pid]:
			state = "killed"
		}
		fmt.Fprintf(&b, "+%.1fs:%d(%s)", d.at.Sub(t0).Seconds(), d.pid, state)
	}
	b.WriteString("] acks=[")
	for i, c := range h.acks[id] {
		if i > 0 {
			b.WriteString(" ")
		}
		what := "ack"
		if c.deadline >= 0 {
			what = fmt.Sprintf("deadline=%d", c.deadline)
		}
		fmt.Fprintf(&b, "+%.1fs:%d:%s(ok=%v)", c.at.Sub(t0).Seconds(), c.pid, what, c.ok)
	}
	b.WriteString("] published=[")
	for i, p := range h.published[id] {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "+%.1fs:%s(ok=%v)", p.at.Sub(t0).Seconds(), p.topic[strings.LastIndexByte(p.topic, '/')+1:], p.ok)
	}
	b.WriteString("]")
	return b.String()
}
