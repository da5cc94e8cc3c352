package gcppubsub

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/retry"
)

// A subscription whose Receive stopped is received again after
// receiveRetryFirst, then twice as long after each further stop, up to
// receiveRetryMax.
const (
	receiveRetryFirst = time.Second
	receiveRetryMax   = 30 * time.Second
)

// source receives one subscription for the claim loop
// (transport.NewSubscriber). The client library calls back once per message
// on goroutines of its own; each callback offers its message to the loop and
// then waits until the core settles it, so that Receive, which returns only
// once every callback did, keeps extending the lease of every request in
// flight and can still send its ack.
type source struct {
	t              *Transport
	subscription   string
	maxConcurrency int

	incoming chan *pending // offered by callbacks, taken by Claim and Wait
	stash    *pending      // taken by an idle Wait, handed out by the next Claim (loop goroutine only)

	mu       sync.Mutex
	inflight map[*message.Message]*pending
}

// pending is one received message on its way through the core.
type pending struct {
	pm      *pubsub.Message
	msg     *message.Message
	settled chan bool // receives the outcome once: true acks, false nacks
}

var _ transport.Source = (*source)(nil)

// Open starts receiving. Receiving stops when ctx ends (the subscription
// ends) or the transport closes; deliveries already made are still acked or
// nacked afterwards, until the transport closes, which nacks the rest.
func (s *source) Open(ctx context.Context) error {
	t := s.t
	c, err := t.conn(ctx)
	if err != nil {
		return err
	}
	ps := c.Subscriber(t.fullName("subscriptions", s.subscription))
	maxOut := t.opts.MaxOutstandingMessages
	if maxOut == 0 {
		maxOut = 2*max(s.maxConcurrency, 1) + 16
	}
	ps.ReceiveSettings.MaxOutstandingMessages = maxOut
	ps.ReceiveSettings.MaxExtension = time.Duration(t.opts.MaxExtensionSeconds) * time.Second
	// Several streaming pulls: one delivers a bounded rate, so a queue
	// with many credits opens several (Options.NumStreams). Flow control
	// (MaxOutstandingMessages) stays per subscription, across the streams.
	ps.ReceiveSettings.NumGoroutines = t.opts.streams(s.maxConcurrency)

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		cancel()
		return ErrClosed
	}
	t.receives.Add(2)
	t.mu.Unlock()
	go func() {
		defer t.receives.Done()
		select {
		case <-ctx.Done():
		case <-t.closing:
		}
		cancel()
	}()
	go func() {
		defer t.receives.Done()
		defer cancel()
		// Receive ends on a permanent error too (a subscription that does not
		// exist yet, lost permissions): keep trying, loudly, rather than sit
		// silently with no work (sluice_transport_events_total{event="receive_errors"}).
		h := t.history(s.subscription)
		receive := func() (struct{}, error) {
			err := ps.Receive(rctx, func(_ context.Context, pm *pubsub.Message) {
				h.received(t.now())
				s.handle(rctx, pm)
			})
			if rctx.Err() != nil {
				return struct{}{}, backoff.Permanent(rctx.Err())
			}
			if err == nil {
				err = errors.New("receive returned without an error")
			}
			h.failed(t.now(), err)
			t.receiveErrors.Add(1)
			return struct{}{}, err
		}
		// Until the subscription ends: no bound on the tries nor the time.
		_, _ = backoff.Retry(rctx, receive,
			backoff.WithBackOff(retry.Doubling(receiveRetryFirst, receiveRetryMax)),
			backoff.WithMaxElapsedTime(0),
			backoff.WithNotify(func(err error, next time.Duration) {
				t.log.Error("receiving stopped; trying again", "subscription", s.subscription, "err", err, "retry_in", next.String())
			}))
	}()
	return nil
}

// handle carries one Pub/Sub message: hold it until due (a retry), offer it
// to the claim loop, and ack or nack it as the core settles it.
func (s *source) handle(ctx context.Context, pm *pubsub.Message) {
	if nb := pm.Attributes[transport.MetaNotBefore]; nb != "" {
		if ms, err := strconv.ParseInt(nb, 10, 64); err == nil {
			if wait := time.Until(time.UnixMilli(ms)); wait > 0 {
				timer := time.NewTimer(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					pm.Nack()
					return
				}
			}
		}
	}
	p := &pending{pm: pm, settled: make(chan bool, 1)}
	select {
	case s.incoming <- p:
	case <-ctx.Done():
		pm.Nack()
		return
	}
	select {
	case acked := <-p.settled:
		if acked {
			pm.Ack()
		} else {
			pm.Nack()
		}
	case <-s.t.closing:
		pm.Nack() // handed back: Pub/Sub redelivers it
	}
}

// deliver turns an offered message into the core's message.
func (s *source) deliver(p *pending) *message.Message {
	p.msg = message.NewMessage(p.pm.ID, MergeAttributes(p.pm.Data, p.pm.Attributes))
	s.mu.Lock()
	s.inflight[p.msg] = p
	s.mu.Unlock()
	return p.msg
}

// Claim takes up to n messages the client library has offered.
func (s *source) Claim(_ context.Context, n int) ([]*message.Message, error) {
	out := make([]*message.Message, 0, n)
	if p := s.stash; p != nil {
		s.stash = nil
		out = append(out, s.deliver(p))
	}
	for len(out) < n {
		select {
		case p := <-s.incoming:
			out = append(out, s.deliver(p))
		default:
			return out, nil
		}
	}
	return out, nil
}

// Wait waits for the next message to be offered (held for the next Claim).
func (s *source) Wait(ctx context.Context) {
	select {
	case p := <-s.incoming:
		s.stash = p
	case <-ctx.Done():
	}
}

// Settle acks or nacks the Pub/Sub message behind m.
func (s *source) Settle(m *message.Message, acked bool) {
	s.mu.Lock()
	p := s.inflight[m]
	delete(s.inflight, m)
	s.mu.Unlock()
	if p != nil {
		p.settled <- acked
	}
}

// HandBack nacks messages claimed but never delivered.
func (s *source) HandBack(ms []*message.Message) {
	for _, m := range ms {
		s.Settle(m, false)
	}
}

// Close nacks a message an idle Wait took; the receivers stop with the
// subscription's context and are waited for by Transport.Close.
func (s *source) Close() error {
	if p := s.stash; p != nil {
		s.stash = nil
		p.settled <- false // its callback waits for this, and nacks
	}
	return nil
}

// internalAttribute reports attributes that are not request metadata.
func internalAttribute(k string) bool {
	return strings.HasPrefix(k, "sluice_") || strings.HasPrefix(k, "_watermill") || strings.HasPrefix(k, "googclient_")
}

// MergeAttributes merges a Pub/Sub message's attributes into the metadata
// of the request in data (flat form, or the envelope's data): a key the
// request already has keeps its value. Data that is not a JSON object, or
// whose metadata is not a string map, is returned unchanged (the decoder
// reports it).
func MergeAttributes(data []byte, attrs map[string]string) []byte {
	n := 0
	for k := range attrs {
		if !internalAttribute(k) {
			n++
		}
	}
	if n == 0 {
		return data
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return data
	}
	target, nested := top, false
	if raw, ok := top["data"]; ok {
		if _, env := top["request_kind"]; env {
			if err := json.Unmarshal(raw, &target); err != nil {
				return data
			}
			nested = true
		}
	}
	md := map[string]string{}
	if raw, ok := target["metadata"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &md); err != nil {
			return data
		}
	}
	for k, v := range attrs {
		if _, has := md[k]; !has && !internalAttribute(k) {
			md[k] = v
		}
	}
	b, err := json.Marshal(md)
	if err != nil {
		return data
	}
	target["metadata"] = b
	if nested {
		if top["data"], err = json.Marshal(target); err != nil {
			return data
		}
	}
	merged, err := json.Marshal(top)
	if err != nil {
		return data
	}
	return merged
}
