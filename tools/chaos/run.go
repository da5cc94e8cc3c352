package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// session is one fault's run on one broker: the rig, the broker, the
// gateway, the ledger and the result reader.
type session struct {
	r      *rig
	b      broker
	gw     *gateway
	l      *ledger
	v      *verdict
	stopRd context.CancelFunc
	rdDone chan struct{}
}

// open starts a session: servers, broker, gateway and the result reader.
// On error the verdict already says why and the session is closed.
func open(ctx context.Context, e *env, name string, tc transportCase, tw brokerTweak, f gatewayFaults) (*session, *verdict) {
	v := &verdict{extra: figures{}}
	r, err := newRig(e.bin, e.root, name)
	if err != nil {
		v.fail("scratch dir: %v", err)
		return nil, v
	}
	b, err := tc.open(ctx, r, tw)
	if err != nil {
		r.close()
		v.fail("%s: %v", tc.name, err)
		return nil, v
	}
	gw, err := startGateway(f)
	if err != nil {
		b.close()
		r.close()
		v.fail("gateway: %v", err)
		return nil, v
	}
	s := &session{r: r, b: b, gw: gw, l: newLedger(f.alwaysOK()), v: v, rdDone: make(chan struct{})}
	gw.observe(s.l.dispatched) // the gateway's calls go into the history
	rctx, cancel := context.WithCancel(ctx)
	s.stopRd = cancel
	go func() { defer close(s.rdDone); b.readResults(rctx, s.l) }()
	return s, v
}

// close stops the reader, the replicas, the gateway and the servers.
func (s *session) close() {
	s.stopRd()
	<-s.rdDone
	s.r.close()
	s.gw.close()
	s.b.close()
}

// send sends msgs through the broker and notes in the history when the
// send returned.
func (s *session) send(ctx context.Context, msgs []outMsg) error {
	err := s.b.send(ctx, msgs)
	if err == nil {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.id
		}
		s.l.sentDone(ids, time.Now())
	}
	return err
}

// goodMessages makes n good requests with ids prefix-00000..., due in
// deadline, and records them in the ledger.
func (s *session) goodMessages(prefix string, n int, deadline time.Duration) []outMsg {
	dl := time.Now().Add(deadline)
	msgs := make([]outMsg, n)
	for i := range msgs {
		id := fmt.Sprintf("%s-%05d", prefix, i)
		msgs[i] = outMsg{id: id, body: flatRequest(id, dl)}
		s.l.expect(id, dl)
	}
	return msgs
}

// waitComplete waits until every id sent has its results, up to within;
// it reports whether that happened.
func (s *session) waitComplete(ctx context.Context, within time.Duration) bool {
	deadline := time.Now().Add(within)
	next := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if s.l.complete() {
			return true
		}
		if time.Now().After(next) {
			t := s.l.tally()
			fmt.Fprintf(os.Stderr, "chaos: %s: still waiting: %d of %d answered\n", s.r.name, t.answered, t.requests)
			next = time.Now().Add(30 * time.Second)
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return s.l.complete()
}

// quiet keeps reading until no result came for d (a late duplicate has
// the time to show), at most limit.
func (s *session) quiet(ctx context.Context, d, limit time.Duration) {
	end := time.Now().Add(limit)
	last, lastTotal := time.Now(), -1
	for time.Now().Before(end) && ctx.Err() == nil {
		s.l.mu.Lock()
		tot := s.l.total
		s.l.mu.Unlock()
		if tot != lastTotal {
			last, lastTotal = time.Now(), tot
		}
		if time.Since(last) >= d {
			return
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// checkCrashes fails the verdict for every replica that exited on its own.
func (s *session) checkCrashes() int {
	n := 0
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	for _, p := range s.r.replicas {
		if p.crashed() {
			n++
			s.v.fail("replica %s exited on its own: %s (log %s)", p.name, p.exitStatus(), p.logPath)
		}
	}
	return n
}

// waitStalled waits until every id sent has its results (it then reports
// true), or until, at least minWait after since, no gateway call has run
// and no result has come for quietFor, or until maxWait after since.
func (s *session) waitStalled(ctx context.Context, since time.Time, minWait, maxWait, quietFor time.Duration) bool {
	last, lastTotal := time.Now(), -1
	for time.Since(since) < maxWait && ctx.Err() == nil {
		if s.l.complete() {
			return true
		}
		s.l.mu.Lock()
		tot := s.l.total
		s.l.mu.Unlock()
		if tot != lastTotal || len(s.gw.inflightIDs()) > 0 {
			last, lastTotal = time.Now(), tot
		}
		if time.Since(since) >= minWait && time.Since(last) >= quietFor {
			return false
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return s.l.complete()
}
