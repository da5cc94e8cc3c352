package openai_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/openai"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/configtypes"
	memtransport "github.com/sluice-io/sluice/transports/memory"
)

// A caller that hangs up, a call whose deadline passes: what the front
// does with the request it queued and with the result that may still come.

// watchedProducer is the memory producer, noting what is enqueued and
// cancelled; with deaf set it notes the cancels and does not pass them on
// (a cancel the dispatcher missed).
type watchedProducer struct {
	submit.Producer
	deaf    bool
	mu      sync.Mutex
	reqs    []*wire.Request
	cancels []transport.Cancellation
}

func (p *watchedProducer) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	p.mu.Lock()
	p.reqs = append(p.reqs, reqs...)
	p.mu.Unlock()
	return p.Producer.Enqueue(ctx, queue, reqs)
}

func (p *watchedProducer) Cancel(ctx context.Context, queue string, c transport.Cancellation) (int, error) {
	p.mu.Lock()
	p.cancels = append(p.cancels, c)
	p.mu.Unlock()
	if p.deaf {
		return 0, nil
	}
	return p.Producer.Cancel(ctx, queue, c)
}

func (p *watchedProducer) seen() (reqs []*wire.Request, cancels []transport.Cancellation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*wire.Request(nil), p.reqs...), append([]transport.Cancellation(nil), p.cancels...)
}

// hangUpRig is a front on a memory transport (with a dispatcher when
// gateway is set) served over HTTP.
type hangUpRig struct {
	mem   *memtransport.Transport
	prod  *watchedProducer
	front *openai.Front
	srv   *httptest.Server
}

func newHangUpRig(t *testing.T, gateway string, deaf bool, cfg openai.Config) *hangUpRig {
	t.Helper()
	mem := memtransport.New(memtransport.Options{})
	if gateway != "" {
		ad := app.NewAdapters()
		if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
			t.Fatal(err)
		}
		a, err := app.New(&config.Config{Transport: memtransport.Name, Concurrency: 2, MetricsPort: -1, HealthPort: -1,
			TransportConfig: config.TransportConfig{ResultQueueName: "default-results",
				Queues: []config.Queue{{Queue: transport.Queue{Name: "chat"}, IGWBaseURL: gateway, GateType: constant.Type}}}},
			app.Options{Adapters: ad, Transport: mem})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("sluice: %v", err)
			}
		})
	}
	cfg.DefaultQueue = "chat"
	rg := &hangUpRig{mem: mem, prod: &watchedProducer{Producer: memtransport.NewProducer(mem, submit.ReaderOptions{}), deaf: deaf}}
	var err error
	if rg.front, err = openai.New(cfg, rg.prod); err != nil {
		t.Fatal(err)
	}
	rg.srv = httptest.NewServer(rg.front)
	t.Cleanup(func() {
		rg.srv.Close()
		_ = rg.front.Close()
	})
	return rg
}

// call starts a chat completion of prompt that the caller abandons when
// the returned cancel is called; its error comes on the channel.
func (rg *hangUpRig) call(t *testing.T, prompt string, header map[string]string) (context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rg.srv.URL+openai.PathChatCompletions,
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+prompt+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = errors.New("answered " + resp.Status)
		}
		errc <- err
	}()
	return cancel, errc
}

// queued waits until the front enqueued one request and returns it.
func (rg *hangUpRig) queued(t *testing.T) *wire.Request {
	t.Helper()
	eventually(t, "the call queued", func() bool { reqs, _ := rg.prod.seen(); return len(reqs) == 1 })
	reqs, _ := rg.prod.seen()
	return reqs[0]
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not so after %v: %s", wait, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// closesSoon: Front.Close returns at once, its clean-up of abandoned
// calls stopped with it (not at the end of the second it waits for a
// result in).
func closesSoon(t *testing.T, f *openai.Front) {
	t.Helper()
	start := time.Now()
	_ = f.Close()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close took %v", took)
	}
}

// TestHangUpWhileQueued: the caller hangs up while its request waits on
// the queue (nothing dispatches it): the front cancels the request by its
// id on its queue, which removes it, and nothing is ever answered on its
// route.
func TestHangUpWhileQueued(t *testing.T) {
	rg := newHangUpRig(t, "", false, openai.Config{})
	hangUp, errc := rg.call(t, "hello", nil)
	req := rg.queued(t)
	if d, _ := rg.mem.Depth(context.Background(), transport.Queue{Name: "chat"}); d.Waiting != 1 {
		t.Fatalf("queue %+v, want the call waiting", d)
	}
	hangUp()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	eventually(t, "the request removed from the queue", func() bool {
		d, _ := rg.mem.Depth(context.Background(), transport.Queue{Name: "chat"})
		return d.Waiting == 0
	})
	_, cancels := rg.prod.seen()
	if len(cancels) == 0 || cancels[0] != (transport.Cancellation{RequestID: req.ID}) {
		t.Fatalf("cancels %+v, want one of request %s", cancels, req.ID)
	}
	closesSoon(t, rg.front) // its deadline is 10 minutes away
	if n, _ := rg.mem.ResultCount(req.ResultQueueName); n != 0 {
		t.Errorf("%d results on the route of a removed request", n)
	}
}

// TestHangUpCancelSentAgain: a cancel the dispatcher misses is sent again
// every second until the request's result comes; that result is acked (the
// route left empty) and the cancels stop.
func TestHangUpCancelSentAgain(t *testing.T) {
	rg := newHangUpRig(t, "", true, openai.Config{})
	hangUp, errc := rg.call(t, "hello", nil)
	req := rg.queued(t)
	hangUp()
	<-errc
	start := time.Now()
	eventually(t, "the cancel sent a second time", func() bool { _, c := rg.prod.seen(); return len(c) >= 2 })
	if took := time.Since(start); took < 800*time.Millisecond {
		t.Errorf("the second cancel came %v after the hang-up, want about a second", took)
	}
	// The dispatcher answers it at last.
	pub, _ := rg.mem.Publisher(transport.Queue{Name: "chat"})
	res := wire.Result{ID: req.ID, ErrorCode: wire.CodeCancelled}
	if err := pub.Publish(req.ResultQueueName, message.NewMessage(req.ID, res.Marshal())); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the result acked", func() bool { n, _ := rg.mem.ResultCount(req.ResultQueueName); return n == 0 })
	_, cancels := rg.prod.seen()
	time.Sleep(1500 * time.Millisecond)
	if _, after := rg.prod.seen(); len(after) != len(cancels) {
		t.Errorf("%d cancels after the result came, want none", len(after)-len(cancels))
	}
	for _, c := range cancels {
		if c != (transport.Cancellation{RequestID: req.ID}) {
			t.Errorf("cancel %+v, want request %s", c, req.ID)
		}
	}
	closesSoon(t, rg.front)
}

// TestHangUpGivesUpAfterDeadline: with no result ever, the front stops
// cancelling at the request's deadline plus twice the grace, by itself.
func TestHangUpGivesUpAfterDeadline(t *testing.T) {
	const grace = 250 * time.Millisecond
	rg := newHangUpRig(t, "", true, openai.Config{ResultGrace: configtypes.Duration(grace)})
	hangUp, errc := rg.call(t, "hello", map[string]string{openai.HeaderTimeout: "1s"})
	req := rg.queued(t)
	hangUp()
	<-errc
	time.Sleep(time.Until(req.Deadline.Add(2*grace)) + 1500*time.Millisecond) // the last Next ends 1s after its cancel
	_, before := rg.prod.seen()
	time.Sleep(1500 * time.Millisecond)
	_, after := rg.prod.seen()
	if len(before) == 0 || len(after) != len(before) || len(after) > 3 {
		t.Errorf("%d cancels by the deadline plus twice the grace, %d later; want some, then none", len(before), len(after))
	}
}

// TestHangUpInFlight: the caller hangs up while the gateway works on its
// call: the dispatcher aborts the gateway call and writes the request's
// one result, which the front acks; nothing is dispatched again and no
// second result comes.
func TestHangUpInFlight(t *testing.T) {
	gw := newGateway(t)
	rg := newHangUpRig(t, gw.srv.URL, false, openai.Config{})
	hangUp, errc := rg.call(t, "block", nil)
	req := rg.queued(t)
	select {
	case <-gw.arrived:
	case <-time.After(wait):
		t.Fatal("the call never reached the gateway")
	}
	hangUp()
	<-errc
	select {
	case <-gw.aborted:
	case <-time.After(wait):
		t.Fatal("the gateway call was not aborted")
	}
	// The cancelled result comes and is acked: the route ends empty.
	eventually(t, "the request answered and its result acked", func() bool {
		n, _ := rg.mem.ResultCount(req.ResultQueueName)
		d, _ := rg.mem.Depth(context.Background(), transport.Queue{Name: "chat"})
		return n == 0 && d.InFlight == 0 && d.Waiting == 0 && d.Delayed == 0
	})
	closesSoon(t, rg.front)
	time.Sleep(time.Second)
	if n, _ := rg.mem.ResultCount(req.ResultQueueName); n != 0 {
		t.Errorf("%d more results on the route after the first", n)
	}
	select {
	case p := <-gw.arrived:
		t.Errorf("the gateway got the call again (%q)", p)
	default:
	}
}

// TestNoResultByDeadline: with no result by the deadline plus the grace,
// the front answers 504 deadline_exceeded itself, cancels the request, and
// acks its result when it comes late.
func TestNoResultByDeadline(t *testing.T) {
	const grace = 200 * time.Millisecond
	p := &fakeProducer{}
	f := newFakeFront(t, p, openai.Config{ResultGrace: configtypes.Duration(grace)})
	start := time.Now()
	rec := post(f, openai.PathChatCompletions, `{"model":"m"}`, map[string]string{openai.HeaderTimeout: "0.3"})
	took := time.Since(start)
	if rec.Code != http.StatusGatewayTimeout || took < 300*time.Millisecond+grace {
		t.Fatalf("status %d after %v, want 504 after the timeout and the grace", rec.Code, took)
	}
	if _, typ, code, _ := errorOf(t, rec.Body.Bytes()); typ != "timeout" || code != "deadline_exceeded" {
		t.Errorf("error type %q code %q", typ, code)
	}
	reqs, _, _, _, _ := p.state()
	if rec.Header().Get(openai.HeaderErrorCode) != string(wire.CodeDeadlineExceeded) || rec.Header().Get(openai.HeaderRequestID) != reqs[0].ID {
		t.Errorf("headers %v", rec.Header())
	}
	eventually(t, "the request cancelled", func() bool { _, _, c, _, _ := p.state(); return len(c) > 0 })
	if _, _, cancels, _, _ := p.state(); cancels[0] != (transport.Cancellation{RequestID: reqs[0].ID}) {
		t.Errorf("cancel %+v", cancels[0])
	}
	p.publish(reqs[0].ResultQueueName, &wire.Result{ID: reqs[0].ID, ErrorCode: wire.CodeDeadlineExceeded})
	eventually(t, "the late result acked", func() bool { _, _, _, acked, _ := p.state(); return len(acked) == 1 && acked[0] == reqs[0].ID })
	eventually(t, "the route closed", func() bool { _, _, _, _, closed := p.state(); return len(closed) == 1 })
}

// TestNoResultByDeadlineStreamed: the same for a streamed call whose
// stream started: keep-alives, then one deadline_exceeded error event and
// no [DONE].
func TestNoResultByDeadlineStreamed(t *testing.T) {
	p := &fakeProducer{}
	f := newFakeFront(t, p, openai.Config{ResultGrace: configtypes.Duration(100 * time.Millisecond), KeepAlive: configtypes.Duration(50 * time.Millisecond)})
	srv := httptest.NewServer(f)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+openai.PathChatCompletions, strings.NewReader(`{"model":"m","stream":true}`))
	req.Header.Set(openai.HeaderTimeout, "300ms")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, comments := sseEvents(t, resp.Body)
	if resp.StatusCode != 200 || comments == 0 || len(data) != 1 {
		t.Fatalf("status %d, %d comments, events %q; want 200, keep-alives and one event", resp.StatusCode, comments, data)
	}
	if _, typ, code, _ := errorOf(t, []byte(data[0])); typ != "timeout" || code != "deadline_exceeded" {
		t.Errorf("event %s", data[0])
	}
}

// TestStrayResultsOnRoute: results on a call's route that are not its own
// (another id, or undecodable) are acked and skipped; the call is
// answered with its own.
func TestStrayResultsOnRoute(t *testing.T) {
	p := &fakeProducer{}
	p.answer = func(r *wire.Request) *wire.Result {
		p.publish(r.ResultQueueName, &wire.Result{ID: "oa-other", StatusCode: 200, Payload: `{"stray":true}`})
		p.route(r.ResultQueueName) <- submit.Result{Raw: []byte("{"), Err: errors.New("unexpected end of JSON input")}
		return &wire.Result{StatusCode: 200, Payload: `{"mine":true}`}
	}
	rec := post(newFakeFront(t, p, openai.Config{}), openai.PathChatCompletions, `{"model":"m"}`, nil)
	if rec.Code != 200 || rec.Body.String() != `{"mine":true}` {
		t.Fatalf("answer %d %s, want the call's own result", rec.Code, rec.Body)
	}
	reqs, _, _, acked, closed := p.state()
	if len(acked) != 3 || acked[0] != "oa-other" || acked[1] != "" || acked[2] != reqs[0].ID || len(closed) != 1 {
		t.Errorf("acked %q, closed %v; want the two strays and the result acked, the route closed", acked, closed)
	}
}
