package gcppubsub

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/transport"
)

var _ transport.HealthChecker = (*Transport)(nil)

// CheckHealth implements transport.HealthChecker with upstream's probe: the
// subscription of every queue is looked up (GetSubscription, one call per
// queue, all at once). PermissionDenied counts as healthy, as upstream has it:
// a subscriber may lack the right to read a subscription's configuration and
// still receive from it. Any other error means the broker is not usable.
func (t *Transport) CheckHealth(ctx context.Context, queues []transport.Queue) error {
	// The client outlives this call: its creation must not be bound to ctx.
	c, err := t.conn(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	errs := make([]error, len(queues))
	var wg sync.WaitGroup
	for i, q := range queues {
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
