package redissortedset_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// Cancel honoured at the moment of dispatch (issue 44, item 2). A request
// claimed ahead of its credit (prefetch, on by default) waits in the claim
// loop until a call ends; the claim read its cancel marker, but that
// answer is older than the dispatch by as long as it waited. A marker
// written while it waits must stop it: no gateway call starts after the
// marker is written.

// cancelledAhead is what one cancel-at-dispatch run measured.
type cancelledAhead struct {
	// after are the calls started after the first marker was written.
	after []string
	// cancelled are the ids that got a marker.
	cancelled map[string]bool
}

// waitCalls waits until the gateway saw n calls.
func waitCalls(t *testing.T, gw *gateway, n int, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		if _, order := gw.counts(); len(order) >= n {
			return
		}
		if time.Now().After(end) {
			_, order := gw.counts()
			t.Fatalf("%d gateway calls within %s, want %d", len(order), d, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUpstreamCancelClaimedAhead writes the cancel markers of every request
// not yet dispatched while the claim loop holds a batch claimed ahead (their
// claim found no marker) and checks that no call starts after them.
func TestUpstreamCancelClaimedAhead(t *testing.T) {
	f, gw := cutoverFixture(t, 600*time.Millisecond)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results, conc, n = "acme/cancel-ahead", "acme/cancel-ahead:results", 8, 48
	up := upProducer{c: c, queue: q, results: results}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	order := make([]string, n)
	for i := range order {
		order[i] = fmt.Sprintf("ahead-%02d", i)
		tokens[order[i]] = up.submit(t, order[i], dl, payloadFor(order[i]))
	}
	tp := f.transport(rss.Options{PollIntervalMS: 20})
	f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: q, ResultName: results}, IGWBaseURL: f.sim}}, results, conc)
	// The second wave of calls started: its claim also took a batch ahead
	// (the queue is busy), which waits for the second wave to end.
	waitCalls(t, gw, 2*conc, 5*time.Second)
	end := time.Now().Add(2 * time.Second)
	for {
		d, err := rss.QueueDepth(ctx, c, f.prod.Names(), q)
		if err != nil {
			t.Fatal(err)
		}
		if d.InFlight >= 2*conc {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no batch claimed ahead: %d in flight", d.InFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // held ahead for a while: their claim's answer is 100 ms old or more
	called, _ := gw.counts()
	cancelled := map[string]bool{}
	at := time.Now()
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range order {
			if called[id] == 0 {
				bgCancel.Eval(ctx, p, []string{"request-active:" + id, "request-cancel:" + id})
				cancelled[id] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitResults(t, c, results, n, 10*time.Second)
	byID := checkAnsweredOnce(t, c, results, tokens)
	for id, r := range byID {
		checkBGResult(t, r, tokens[id], cancelled[id])
	}
	if after := gw.startedAfter(at); len(after) != 0 {
		t.Errorf("%d gateway calls started after the cancel markers were written (want 0): %v", len(after), after)
	}
	t.Logf("%d of %d requests cancelled while %d were claimed ahead", len(cancelled), n, conc)
}

// TestBatchGatewayCancelAtDispatch plays the batch-gateway's processor
// cancelling a batch at 20 %: 600 lines, concurrency 64, a 1-s gateway; once
// 120 results are in it writes one marker per pending request, one after
// another (its CancelRequests loop), in line order. The gateway calls that
// start after its first marker are counted: upstream v0.9 starts none,
// sluice must start at most a handful (the requests whose turn came before
// their marker was written).
func TestBatchGatewayCancelAtDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs about 5 s")
	}
	f, gw := cutoverFixture(t, time.Second)
	gw.mu.Lock()
	gw.spread = 300 * time.Millisecond // a 1-s gateway on average: 0.7 to 1.3 s
	gw.mu.Unlock()
	c := f.prod.Client()
	const q, base, conc, lines = "acme/batch-q", "acme/results", 64, 600
	list := base + ":replica-2"
	p := &bgProcessor{c: c, list: list, owner: randHex(t, 16), lease: 30 * time.Second,
		up: upProducer{c: c, queue: q, results: list}}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	order := make([]string, lines)
	for i := range order {
		order[i] = fmt.Sprintf("batch_1-line-%03d", i)
		tokens[order[i]] = p.up.submit(t, order[i], dl, payloadFor(order[i]))
	}
	tp := f.transport(rss.Options{})
	f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: q, ResultTTLSeconds: 600}, IGWBaseURL: f.sim}}, base, conc)

	got := map[string]map[string]any{}
	receive := func() bool {
		m, cid := p.receive(t)
		if m == nil {
			return false
		}
		id, _ := m["id"].(string)
		if got[id] != nil {
			t.Errorf("%s received twice", id)
		}
		got[id] = m
		if n := p.ack(t, cid); n != 1 {
			t.Errorf("ack of %s: %d", id, n)
		}
		return true
	}
	end := time.Now().Add(30 * time.Second)
	for len(got) < lines/5 {
		if time.Now().After(end) {
			t.Fatalf("%d results within 30 s", len(got))
		}
		if !receive() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	at := time.Now()
	cancelled := map[string]bool{}
	for _, id := range order {
		if got[id] == nil {
			p.cancel(t, id)
			cancelled[id] = true
		}
	}
	written := time.Since(at)
	for len(got) < lines {
		if time.Now().After(end) {
			t.Fatalf("%d of %d results within 30 s", len(got), lines)
		}
		if !receive() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	after := gw.startedAfter(at)
	calls, _ := gw.counts()
	dispatchedCancelled := 0
	for id := range cancelled {
		if got[id]["error_code"] != "CANCELLED" {
			dispatchedCancelled++
		}
	}
	for id, n := range calls {
		if n != 1 {
			t.Errorf("%s dispatched %d times", id, n)
		}
	}
	t.Logf("%d markers written in %s; %d gateway calls started after the first; %d of the cancelled answered by the gateway",
		len(cancelled), written.Round(time.Millisecond), len(after), dispatchedCancelled)
	if len(after) > 5 {
		t.Errorf("%d gateway calls started after the batch's cancel began (want at most 5): %v", len(after), after)
	}
}
