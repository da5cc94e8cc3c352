// Package transporttest is the conformance suite every sluice transport
// passes: Run drives a transport through the core's contract (credits,
// ack/nack, re-queue, results, close and reopen, concurrent consumers) as
// the pipeline would, with per-transport Features saying what each promises.
//
// A transport's own test file supplies a Harness: how to build the transport
// against a backing server, how a producer enqueues a request, and how a
// consumer reads results.
package transporttest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Ordering is the delivery order a transport promises to one consumer.
type Ordering int

const (
	// Unordered promises nothing.
	Unordered Ordering = iota
	// FIFO delivers in publish order.
	FIFO
	// ByDeadline delivers the earliest deadline first.
	ByDeadline
)

// Features say what a transport promises; the suite checks exactly these.
type Features struct {
	// Ordering is the order one consumer sees (checked with one credit).
	Ordering Ordering
	// AtLeastOnce: a nacked delivery comes back, and so does an un-acked one
	// when the transport is closed and reopened (with Reopen).
	AtLeastOnce bool
	// DelayedRequeue: the transport implements transport.Requeuer and
	// delivers the new bytes no earlier than the due time.
	DelayedRequeue bool
	// RequeueKeepsPlace: with ByDeadline and DelayedRequeue, a re-queued
	// request comes back ahead of the requests of its deadline enqueued
	// after it (as Harness.Publish writes them).
	RequeueKeepsPlace bool
	// Results: results published through Publisher can be read back with
	// Harness.Results.
	Results bool
	// Reopen: a second transport built by Harness.New over the same backing
	// store sees what the first left behind (queued or un-acked messages).
	Reopen bool
	// ConcurrentConsumers: two subscribers on one queue share its messages,
	// each message going to exactly one of them.
	ConcurrentConsumers bool
	// FanOut: every subscriber of a queue gets every message (pub/sub).
	FanOut bool
	// SubscribeFirst: requests published while nobody subscribes are lost,
	// so the suite subscribes before it publishes.
	SubscribeFirst bool
}

// Harness connects the suite to one transport.
type Harness struct {
	// Features are the transport's promises.
	Features Features
	// New builds a transport over the test's backing store; every call
	// must reach the same store (for Reopen). The suite closes it.
	New func(t testing.TB) transport.Transport
	// Queue returns a queue with fresh names, unique within the test.
	Queue func(t testing.TB) transport.Queue
	// Publish enqueues a request on q as a producer would.
	Publish func(t testing.TB, q transport.Queue, payload []byte)
	// Results waits up to timeout for n results on q.ResultName and returns
	// what it found (nil when Features.Results is false).
	Results func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte
	// Settle, when set, is called after subscribing and before publishing
	// (e.g. to let a pub/sub subscription become active).
	Settle func(t testing.TB, q transport.Queue)
}

// Request returns the payload of a flat request with id, deadline in from now.
func Request(id string, deadline time.Duration) []byte {
	return RequestAt(id, time.Now().Add(deadline))
}

// RequestAt returns the payload of a flat request with id and the given
// deadline (to the millisecond, as the wire carries it).
func RequestAt(id string, deadline time.Time) []byte {
	b, err := json.Marshal(map[string]any{
		"id":       id,
		"created":  time.Now().Unix(),
		"deadline": float64(deadline.UnixMilli()) / 1000,
		"payload":  map[string]any{"prompt": "hi " + id},
		"metadata": map[string]string{"job_id": "job-1"},
	})
	if err != nil {
		panic(err) // static shape
	}
	return b
}

// idOf decodes a request's id, failing t when it cannot.
func idOf(t testing.TB, payload []byte) string {
	t.Helper()
	r, err := wire.Decode(payload)
	if err != nil {
		t.Fatalf("delivered payload does not decode: %v: %s", err, payload)
	}
	return r.ID
}

// Run runs the suite against h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	tests := []struct {
		name string
		run  func(t *testing.T, h Harness)
		need func(Features) bool
	}{
		{"DeliverAndAck", testDeliverAndAck, nil},
		{"CreditsBoundInFlight", testCredits, nil},
		{"CreditsFollowBudget", testCreditsFollowBudget, nil},
		{"Ordering", testOrdering, func(f Features) bool { return f.Ordering != Unordered }},
		{"NackHandsBack", testNack, func(f Features) bool { return f.AtLeastOnce }},
		{"DelayedRequeue", testRequeue, func(f Features) bool { return f.DelayedRequeue }},
		{"RequeueKeepsPlace", testRequeueKeepsPlace, func(f Features) bool { return f.RequeueKeepsPlace && f.DelayedRequeue && f.Ordering == ByDeadline }},
		{"Results", testResults, func(f Features) bool { return f.Results }},
		{"CloseAndReopen", testReopen, func(f Features) bool { return f.Reopen }},
		{"ConcurrentConsumers", testConcurrent, func(f Features) bool { return f.ConcurrentConsumers || f.FanOut }},
		{"PublishRequest", testPublishRequest, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.need != nil && !tc.need(h.Features) {
				t.Logf("not promised by this transport (features %+v)", h.Features)
				return
			}
			tc.run(t, h)
		})
	}
}

// consumer is one subscription as the pipeline holds it.
type consumer struct {
	sub     message.Subscriber
	credits *credit.Pool
	ch      <-chan *message.Message
	cancel  context.CancelFunc
}

func subscribe(t testing.TB, h Harness, tp transport.Transport, q transport.Queue, max int) *consumer {
	t.Helper()
	credits := credit.NewPool(max, credit.Ramp{})
	credits.SetBudget(1)
	sub, err := transport.NewSubscriber(tp, q, credits, nil)
	if err != nil {
		t.Fatalf("Subscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, q.Name)
	if err != nil {
		cancel()
		t.Fatalf("Subscribe: %v", err)
	}
	c := &consumer{sub: sub, credits: credits, ch: ch, cancel: cancel}
	if h.Settle != nil {
		h.Settle(t, q)
	}
	return c
}

func (c *consumer) close(t testing.TB) {
	t.Helper()
	c.cancel()
	if err := c.sub.Close(); err != nil {
		t.Errorf("subscriber Close: %v", err)
	}
}

// next waits up to d for a delivery; nil when none came.
func (c *consumer) next(d time.Duration) *message.Message {
	select {
	case m, ok := <-c.ch:
		if !ok {
			return nil
		}
		return m
	case <-time.After(d):
		return nil
	}
}

func (c *consumer) mustNext(t testing.TB, d time.Duration, what string) *message.Message {
	t.Helper()
	m := c.next(d)
	if m == nil {
		t.Fatalf("no delivery within %s (%s)", d, what)
	}
	return m
}

// answer ends a delivery as the core does: it publishes a result carrying
// the delivery's metadata (a transport may fence the write with it) through
// the transport's publisher, then acks.
func answer(t testing.TB, tp transport.Transport, q transport.Queue, m *message.Message) {
	t.Helper()
	pub, err := tp.Publisher(q)
	if err != nil {
		t.Fatalf("Publisher: %v", err)
	}
	r, err := wire.Decode(m.Payload)
	if err != nil {
		t.Fatalf("delivered payload does not decode: %v", err)
	}
	res := &wire.Result{ID: r.ID, StatusCode: 200, Payload: `{"ok":true}`, Metadata: r.Metadata}
	out := message.NewMessage(m.UUID, res.Marshal())
	out.Metadata = m.Metadata
	if err := pub.Publish(q.ResultName, out); err != nil {
		t.Fatalf("publish the result of %s: %v", r.ID, err)
	}
	_ = pub.Close()
	transport.Ack(m)
}

func newTransport(t testing.TB, h Harness) transport.Transport {
	t.Helper()
	tp := h.New(t)
	t.Cleanup(func() { _ = tp.Close() })
	return tp
}

const wait = 10 * time.Second

func testDeliverAndAck(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	c := subscribe(t, h, tp, q, 64)
	defer c.close(t)
	const n = 50
	want := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("r%d", i)
		want[id] = true
		h.Publish(t, q, Request(id, time.Hour))
	}
	for range n {
		m := c.mustNext(t, wait, "delivering published requests")
		id := idOf(t, m.Payload)
		if !want[id] {
			t.Fatalf("unexpected or duplicate delivery %q", id)
		}
		delete(want, id)
		answer(t, tp, q, m)
	}
	if m := c.next(300 * time.Millisecond); m != nil {
		t.Fatalf("extra delivery after all were acked: %s", m.Payload)
	}
	c.close(t)
	waitCredits(t, c.credits, 0)
}

// waitCredits waits until the credits in use come down to n. A subscriber
// may hold credits while it waits for new messages, so the suite checks
// after closing it.
func waitCredits(t testing.TB, c *credit.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		inflight, _, _ := c.Snapshot()
		if inflight == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("credits in use: %d, want %d", inflight, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testCredits(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	const limit = 3
	c := subscribe(t, h, tp, q, limit)
	defer c.close(t)
	for i := range 6 {
		h.Publish(t, q, Request(fmt.Sprintf("c%d", i), time.Hour))
	}
	var held []*message.Message
	for range limit {
		held = append(held, c.mustNext(t, wait, "up to the credit limit"))
	}
	if m := c.next(300 * time.Millisecond); m != nil {
		t.Fatalf("a delivery beyond the %d credits: %s", limit, m.Payload)
	}
	answer(t, tp, q, held[0])
	held = append(held[1:], c.mustNext(t, wait, "after one ack freed a credit"))
	for _, m := range held {
		answer(t, tp, q, m)
	}
	for range 2 {
		answer(t, tp, q, c.mustNext(t, wait, "the rest"))
	}
	c.close(t)
	waitCredits(t, c.credits, 0)
}

// testCreditsFollowBudget moves the budget while requests flow and are
// settled (answered, or nacked where the transport promises redelivery) at
// random: every delivery holds a credit (deliveries not yet settled never
// exceed the credits taken, which never exceed the maximum); once the budget
// is 0 and what was granted before has come out, nothing is delivered; and
// every request is answered exactly once.
func testCreditsFollowBudget(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	const max, n = 8, 120
	c := subscribe(t, h, tp, q, max)
	defer c.close(t)
	for i := range n {
		h.Publish(t, q, Request(fmt.Sprintf("b%d", i), time.Hour))
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var held []*message.Message
	answered := map[string]int{}
	settle := func(m *message.Message) {
		if h.Features.AtLeastOnce && rng.IntN(5) == 0 {
			transport.Nack(m)
			return
		}
		answered[idOf(t, m.Payload)]++
		answer(t, tp, q, m)
	}
	receive := func(d time.Duration) bool {
		m := c.next(d)
		if m == nil {
			return false
		}
		held = append(held, m)
		inflight, _, _ := c.credits.Snapshot()
		if len(held) > inflight || inflight > max {
			t.Fatalf("%d deliveries unsettled, %d credits taken, max %d", len(held), inflight, max)
		}
		return true
	}
	deadline := time.Now().Add(3 * wait)
	for phase := 0; len(answered) < n; phase++ {
		if time.Now().After(deadline) {
			t.Fatalf("answered %d of %d requests in %s", len(answered), n, 3*wait)
		}
		budget := []float64{1, 0.25, 0, 0.5, 0.125, 0, 0.75}[phase%7]
		c.credits.SetBudget(budget)
		if budget == 0 {
			// What was granted before the fall may still come out; settle
			// it all, then nothing more may come while the budget is 0.
			for receive(200 * time.Millisecond) {
			}
			for _, m := range held {
				settle(m)
			}
			held = held[:0]
			if receive(300 * time.Millisecond) {
				t.Fatalf("delivered %s with the budget at 0 and nothing in flight", held[len(held)-1].Payload)
			}
			continue
		}
		for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
			got := receive(20 * time.Millisecond)
			for len(held) > 0 && (!got || rng.IntN(3) == 0) {
				m := held[rng.IntN(len(held))]
				held = slices.DeleteFunc(held, func(x *message.Message) bool { return x == m })
				settle(m)
				got = true
			}
		}
	}
	for _, m := range held {
		settle(m)
	}
	for id, k := range answered {
		if k != 1 {
			t.Fatalf("request %s answered %d times", id, k)
		}
	}
}

func testOrdering(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	var c *consumer
	if h.Features.SubscribeFirst {
		c = subscribe(t, h, tp, q, 1)
		defer c.close(t)
	}
	const n = 10
	var want []string
	for i := range n {
		id := fmt.Sprintf("o%d", i)
		d := time.Hour + time.Duration(i)*time.Minute
		if h.Features.Ordering == ByDeadline {
			d = time.Hour + time.Duration(n-i)*time.Minute // published latest deadline first
			want = append([]string{id}, want...)
		} else {
			want = append(want, id)
		}
		h.Publish(t, q, Request(id, d))
	}
	if c == nil {
		c = subscribe(t, h, tp, q, 1)
		defer c.close(t)
	}
	for i := range n {
		m := c.mustNext(t, wait, "ordered delivery")
		if got := idOf(t, m.Payload); got != want[i] {
			t.Fatalf("delivery %d: got %s, want %s (order %v)", i, got, want[i], want)
		}
		answer(t, tp, q, m)
	}
}

func testNack(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	c := subscribe(t, h, tp, q, 4)
	defer c.close(t)
	h.Publish(t, q, Request("n1", time.Hour))
	m := c.mustNext(t, wait, "first delivery")
	transport.Nack(m)
	again := c.mustNext(t, wait, "redelivery after nack")
	if got := idOf(t, again.Payload); got != "n1" {
		t.Fatalf("redelivered %s, want n1", got)
	}
	answer(t, tp, q, again)
	if m := c.next(300 * time.Millisecond); m != nil {
		t.Fatalf("delivered again after ack: %s", m.Payload)
	}
	c.close(t)
	waitCredits(t, c.credits, 0)
}

func testRequeue(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	rq, ok := tp.(transport.Requeuer)
	if !ok {
		t.Fatalf("Features.DelayedRequeue is set but %T is not a transport.Requeuer", tp)
	}
	q := h.Queue(t)
	c := subscribe(t, h, tp, q, 4)
	defer c.close(t)
	h.Publish(t, q, Request("d1", time.Hour))
	m := c.mustNext(t, wait, "first delivery")
	next, err := wire.WithRetryCount(m.Payload, 1)
	if err != nil {
		t.Fatal(err)
	}
	const delay = 700 * time.Millisecond
	due := time.Now().Add(delay)
	if err := rq.Requeue(context.Background(), q, m, next, due); err != nil {
		t.Fatalf("Requeue: %v", err)
	}
	transport.Ack(m)
	again := c.mustNext(t, wait, "the re-queued request")
	if early := time.Until(due); early > 50*time.Millisecond {
		t.Fatalf("re-queued request delivered %s before its due time", early)
	}
	r, err := wire.Decode(again.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "d1" || r.RetryCount != 1 {
		t.Fatalf("re-queued request: id %s retry %d, want d1 retry 1", r.ID, r.RetryCount)
	}
	answer(t, tp, q, again)
	if m := c.next(300 * time.Millisecond); m != nil {
		t.Fatalf("old bytes delivered again after Requeue: %s", m.Payload)
	}
}

// testRequeueKeepsPlace: a re-queued request comes back ahead of the
// requests with its deadline that were enqueued after it (a retried or
// evicted request does not lose its turn; upstream's enqueue sequence).
func testRequeueKeepsPlace(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	rq, ok := tp.(transport.Requeuer)
	if !ok {
		t.Fatalf("Features.DelayedRequeue is set but %T is not a transport.Requeuer", tp)
	}
	q := h.Queue(t)
	deadline := time.Now().Add(time.Hour)
	for _, id := range []string{"k1", "k2", "k3"} {
		h.Publish(t, q, RequestAt(id, deadline))
	}
	c := subscribe(t, h, tp, q, 1)
	defer c.close(t)
	m := c.mustNext(t, wait, "first delivery")
	if got := idOf(t, m.Payload); got != "k1" {
		t.Fatalf("first delivery %s, want k1 (equal deadlines in enqueue order)", got)
	}
	next, err := wire.WithRetryCount(m.Payload, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := rq.Requeue(context.Background(), q, m, next, time.Now()); err != nil {
		t.Fatalf("Requeue: %v", err)
	}
	transport.Ack(m)
	var got []string
	for range 3 {
		m := c.mustNext(t, wait, "delivery after the re-queue")
		got = append(got, idOf(t, m.Payload))
		answer(t, tp, q, m)
	}
	if fmt.Sprint(got) != "[k1 k2 k3]" {
		t.Fatalf("after k1 was re-queued: delivered %v, want [k1 k2 k3] (it keeps its place among equal deadlines)", got)
	}
}

func testResults(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	c := subscribe(t, h, tp, q, 8)
	defer c.close(t)
	const n = 5
	for i := range n {
		h.Publish(t, q, Request(fmt.Sprintf("res%d", i), time.Hour))
	}
	for range n {
		answer(t, tp, q, c.mustNext(t, wait, "requests to answer"))
	}
	got := h.Results(t, q, n, wait)
	if len(got) != n {
		t.Fatalf("read %d results, want %d", len(got), n)
	}
	seen := map[string]bool{}
	for _, b := range got {
		r, err := wire.DecodeResult(b)
		if err != nil {
			t.Fatalf("result does not decode: %v: %s", err, b)
		}
		if seen[r.ID] {
			t.Fatalf("result %s written twice", r.ID)
		}
		seen[r.ID] = true
		if r.Metadata["job_id"] != "job-1" {
			t.Fatalf("result %s lost the request's metadata: %v", r.ID, r.Metadata)
		}
	}
	for i := range n {
		if id := fmt.Sprintf("res%d", i); !seen[id] {
			t.Fatalf("result %s missing (got %d)", id, len(got))
		}
	}
}

func testReopen(t *testing.T, h Harness) {
	q := h.Queue(t)
	tp1 := h.New(t)
	c1 := subscribe(t, h, tp1, q, 1)
	h.Publish(t, q, Request("k1", time.Hour))
	h.Publish(t, q, Request("k2", time.Hour))
	held := c1.mustNext(t, wait, "delivery before close")
	heldID := idOf(t, held.Payload)
	c1.close(t)
	if err := tp1.Close(); err != nil {
		t.Fatalf("Close with a message in flight: %v", err)
	}
	transport.Nack(held) // the core nacks what it could not finish; after Close it must not be lost either
	tp2 := newTransport(t, h)
	c2 := subscribe(t, h, tp2, q, 8)
	defer c2.close(t)
	seen := map[string]bool{}
	for len(seen) < 2 {
		m := c2.mustNext(t, wait, fmt.Sprintf("after reopen (seen %v, the un-acked one was %s)", seen, heldID))
		seen[idOf(t, m.Payload)] = true
		answer(t, tp2, q, m)
	}
}

func testConcurrent(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	q := h.Queue(t)
	a := subscribe(t, h, tp, q, 16)
	defer a.close(t)
	tpB := tp
	if h.Features.Reopen {
		tpB = newTransport(t, h) // a second process over the same store
	}
	b := subscribe(t, h, tpB, q, 16)
	defer b.close(t)
	const n = 40
	for i := range n {
		h.Publish(t, q, Request(fmt.Sprintf("cc%d", i), time.Hour))
	}
	want := n
	if h.Features.FanOut {
		want = 2 * n
	}
	var mu sync.Mutex
	counts := map[string]int{}
	perConsumer := [2]int{}
	var wg sync.WaitGroup
	for i, c := range []*consumer{a, b} {
		tpc := tp
		if i == 1 {
			tpc = tpB
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m := c.next(time.Second)
				if m == nil {
					return
				}
				r, err := wire.Decode(m.Payload)
				if err != nil {
					t.Errorf("decode: %v", err)
					return
				}
				mu.Lock()
				counts[r.ID]++
				perConsumer[i]++
				mu.Unlock()
				answer(t, tpc, q, m)
			}
		}()
	}
	wg.Wait()
	total := perConsumer[0] + perConsumer[1]
	if total != want {
		t.Fatalf("%d deliveries, want %d (per consumer %v)", total, want, perConsumer)
	}
	for id, k := range counts {
		if h.Features.FanOut && k != 2 || !h.Features.FanOut && k != 1 {
			t.Fatalf("request %s delivered %d times", id, k)
		}
	}
	if h.Features.FanOut && (perConsumer[0] != n || perConsumer[1] != n) {
		t.Fatalf("fan-out: per consumer %v, want %d each", perConsumer, n)
	}
}

func testPublishRequest(t *testing.T, h Harness) {
	tp := newTransport(t, h)
	rp, ok := tp.(transport.RequestPublisher)
	if !ok {
		t.Logf("%T publishes no requests (retries use its Requeuer)", tp)
		return
	}
	q := h.Queue(t)
	c := subscribe(t, h, tp, q, 4)
	defer c.close(t)
	if err := rp.PublishRequest(context.Background(), q, Request("p1", time.Hour)); err != nil {
		t.Fatalf("PublishRequest: %v", err)
	}
	m := c.mustNext(t, wait, "a request published through the transport")
	if got := idOf(t, m.Payload); got != "p1" {
		t.Fatalf("got %s, want p1", got)
	}
	answer(t, tp, q, m)
}
