package redissortedset

import (
	"context"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// refreshCancels reloads the cancellations when the epoch moved (epoch ""
// means: read it first) and reports new ones to the watcher, so an
// in-flight request is aborted even when the pub/sub message was missed.
func (t *Transport) refreshCancels(ctx context.Context, epoch string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if epoch == "" {
		e, err := t.client.Get(ctx, t.names.CancelEpoch()).Result()
		if err != nil && !redisNil(err) {
			return
		}
		if e == "" {
			e = "0"
		}
		if t.cancels.Current(e) {
			return
		}
		epoch = e
	}
	if err := t.cancels.Reload(ctx, t.client, t.names.Cancelled(), epoch); err != nil {
		t.log.Warn("reading cancellations failed", "err", err)
	}
}

// Cancelled implements transport.CancelChecker: the request's job or id was
// cancelled through sluice (checked against the replica's copy, kept
// current by every claim), or upstream's key request-cancel:<id> holds the
// request's token.
func (t *Transport) Cancelled(ctx context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	if t.cancels.Has(req) {
		return true, nil
	}
	return t.upCancel.Cancelled(ctx, req)
}

// WatchCancellations implements transport.CancelWatcher: it reports the
// cancellations announced on P:cancel (each announcement, also of one the
// copy holds), and those a claim or the periodic refresh finds new, until
// ctx ends.
func (t *Transport) WatchCancellations(ctx context.Context, fn func(transport.Cancellation)) error {
	return t.cancels.Watch(ctx, t.client, t.names.CancelChannel(), t.closing, fn)
}
