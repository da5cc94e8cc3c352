package gcppubsub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/transport"
)

var _ transport.HealthChecker = (*Transport)(nil)

// historyWindow is how long the receive loop's last outcome decides health
// without a probe, as upstream's.
const historyWindow = 30 * time.Second

// loopHistory is what a subscription's receive loop last did (Unix ns; 0: never).
type loopHistory struct {
	lastOK, lastErr atomic.Int64
	err             atomic.Pointer[error]
}

// history returns the receive-loop history of subscription.
func (t *Transport) history(subscription string) *loopHistory {
	h, _ := t.loops.LoadOrStore(subscription, &loopHistory{})
	return h.(*loopHistory)
}

// received records a message received on the loop.
func (h *loopHistory) received(now time.Time) { h.lastOK.Store(now.UnixNano()) }

// failed records the loop ending with err.
func (h *loopHistory) failed(now time.Time, err error) {
	h.err.Store(&err)
	h.lastErr.Store(now.UnixNano())
}

// verdict is the loop history's say on health: an error newer than the last
// success and under 30 s old is unhealthy, a success under 30 s old is
// healthy (decided: true); otherwise the caller probes.
func (h *loopHistory) verdict(now time.Time) (decided bool, err error) {
	ok, bad := h.lastOK.Load(), h.lastErr.Load()
	cutoff := now.Add(-historyWindow).UnixNano()
	if bad > ok && bad > cutoff {
		if e := h.err.Load(); e != nil {
			return true, fmt.Errorf("receiving failed %s ago: %w", now.Sub(time.Unix(0, bad)).Round(time.Millisecond), *e)
		}
	}
	if ok > cutoff && ok >= bad {
		return true, nil
	}
	return false, nil
}

// CheckHealth implements transport.HealthChecker as upstream's check, per
// queue: a receive-loop error newer than the last message received and under
// 30 s old is unhealthy; a message received in the last 30 s is healthy;
// otherwise the subscription is looked up (GetSubscription, all queues at
// once). PermissionDenied counts as healthy, as upstream has it: a
// subscriber may lack the right to read a subscription's configuration and
// still receive from it. Any other error means the broker is not usable.
func (t *Transport) CheckHealth(ctx context.Context, queues []transport.Queue) error {
	// The client outlives this call: its creation must not be bound to ctx.
	c, err := t.conn(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	errs := make([]error, len(queues))
	var wg sync.WaitGroup
	now := t.now()
	for i, q := range queues {
		if h, ok := t.loops.Load(q.Name); ok {
			if decided, err := h.(*loopHistory).verdict(now); decided {
				if err != nil {
					errs[i] = fmt.Errorf("subscription %s: %w", q.Name, err)
				}
				continue
			}
		}
		wg.Go(func() {
			name := t.fullName("subscriptions", q.Name)
			_, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: name})
			if err != nil && status.Code(err) != codes.PermissionDenied {
				errs[i] = fmt.Errorf("subscription %s: %w", q.Name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
