package gcppubsub

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
)

// subscriber receives one subscription and delivers within its credits.
type subscriber struct {
	t       *Transport
	credits *credit.Pool

	mu      sync.Mutex
	started bool
	closed  bool
	done    chan struct{}
	sendMu  sync.RWMutex // senders hold it for reading; the closer of out for writing
}

var _ message.Subscriber = (*subscriber)(nil)

// Subscribe starts receiving subscription. The channel closes when ctx ends
// or the subscriber closes; deliveries already made are still acked or
// nacked afterwards (until the transport closes, which nacks the rest).
func (s *subscriber) Subscribe(ctx context.Context, subscription string) (<-chan *message.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.started {
		s.mu.Unlock()
		return nil, fmt.Errorf("gcp-pubsub subscriber: already receiving")
	}
	s.started = true
	s.mu.Unlock()
	t := s.t
	c, err := t.conn(ctx)
	if err != nil {
		return nil, err
	}
	ps := c.Subscriber(t.fullName("subscriptions", subscription))
	maxOut := t.opts.MaxOutstandingMessages
	if maxOut == 0 {
		maxOut = 2*s.credits.Max() + 16
	}
	ps.ReceiveSettings.MaxOutstandingMessages = maxOut
	ps.ReceiveSettings.MaxExtension = time.Duration(t.opts.MaxExtensionSeconds) * time.Second
	ps.ReceiveSettings.NumGoroutines = 1

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	out := make(chan *message.Message)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		cancel()
		return nil, ErrClosed
	}
	t.receives.Add(2)
	t.mu.Unlock()
	go func() {
		defer t.receives.Done()
		select {
		case <-ctx.Done():
		case <-s.done:
		case <-t.closing:
		}
		cancel()
		s.sendMu.Lock()
		close(out)
		s.sendMu.Unlock()
	}()
	go func() {
		defer t.receives.Done()
		defer cancel()
		// Receive ends on a permanent error too (a subscription that does not
		// exist yet, lost permissions): keep trying, loudly, rather than sit
		// silently with no work (sluice_transport_events_total{event="receive_errors"}).
		backoff := time.Second
		for {
			err := ps.Receive(rctx, func(_ context.Context, pm *pubsub.Message) { s.handle(rctx, out, pm) })
			if rctx.Err() != nil {
				return
			}
			t.receiveErrors.Add(1)
			t.log.Error("receiving stopped; trying again", "subscription", subscription, "err", err, "retry_in", backoff.String())
			select {
			case <-rctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}()
	return out, nil
}

// handle carries one Pub/Sub message: hold it until due (a retry), take a
// credit, deliver it, and ack or nack it as the core does.
func (s *subscriber) handle(ctx context.Context, out chan<- *message.Message, pm *pubsub.Message) {
	if nb := pm.Attributes[AttrNotBefore]; nb != "" {
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
	if _, err := s.credits.Acquire(ctx, 1); err != nil {
		pm.Nack()
		return
	}
	m := message.NewMessage(pm.ID, MergeAttributes(pm.Data, pm.Attributes))
	s.sendMu.RLock()
	if ctx.Err() != nil {
		s.sendMu.RUnlock()
		s.credits.Release(1)
		pm.Nack()
		return
	}
	select {
	case out <- m:
		s.sendMu.RUnlock()
	case <-ctx.Done():
		s.sendMu.RUnlock()
		s.credits.Release(1)
		pm.Nack()
		return
	}
	defer s.credits.Release(1)
	select {
	case <-m.Acked():
		pm.Ack()
	case <-m.Nacked():
		pm.Nack()
	case <-s.t.closing:
		pm.Nack() // handed back: Pub/Sub redelivers it
	}
}

// Close stops receiving new messages.
func (s *subscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
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
