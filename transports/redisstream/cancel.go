package redisstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/internal/cancelset"
)

// Cancellations through sluice (a producer's Cancel, Producer.Cancel)
// live in three keys named by the cancel_key option (default
// DefaultCancelKey): the sorted set <cancel_key> of entries "job:<job id>"
// and "req:<request id>" scored by when they are forgotten (Unix ms), the
// counter <cancel_key>:epoch, moved by every change of the set, and the channel
// <cancel_key>:notify, which announces each entry. A replica reads the
// epoch after every read of new entries (in the same round trip) and
// reloads the set when it moved, so a request read after a cancellation
// was recorded is checked against it (and answered CANCELLED without
// dispatch); the channel aborts requests in flight.
const (
	// DefaultCancelKey is the cancel_key option's default.
	DefaultCancelKey = "sluice-stream:cancelled"
	// DefaultCancelTTL is how long Cancel remembers a cancellation when
	// it is given no TTL (as upstream: 7 days).
	DefaultCancelTTL = 7 * 24 * time.Hour
)

// cancelScript records entry ARGV[1] in set KEYS[1] until ARGV[2] (Unix
// ms), forgets entries due before ARGV[3] (now), moves epoch KEYS[2] when
// that added or forgot an entry, and announces the entry on channel
// ARGV[4]. A cancellation sent again (the OpenAI front repeats an
// abandoned call's every second) only extends its entry: the replicas'
// copies already hold it, so they do not reload the set for it; its
// announcement still aborts the request where it is now in flight.
var cancelScript = redis.NewScript(`
local added = redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local forgot = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
if added > 0 or forgot > 0 then redis.call('INCR', KEYS[2]) end
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 1
`)

// Cancel records the cancellation c in the cancel keys under cancelKey
// (the transport's cancel_key option) for ttl (DefaultCancelTTL when 0):
// every replica answers the requests it names CANCELLED when they come up
// and aborts those in flight. It is what a producer calls; it removes
// nothing from the stream.
func Cancel(ctx context.Context, c redis.Cmdable, cancelKey string, ca transport.Cancellation, ttl time.Duration) error {
	if cancelKey == "" {
		cancelKey = DefaultCancelKey
	}
	if ttl <= 0 {
		ttl = DefaultCancelTTL
	}
	entries := cancelset.Entries(ca)
	if len(entries) == 0 {
		return errors.New("cancel: neither a job nor a request id")
	}
	now := time.Now()
	for _, e := range entries {
		if err := cancelScript.Run(ctx, c, []string{cancelKey, cancelKey + ":epoch"},
			e, now.Add(ttl).UnixMilli(), now.UnixMilli(), cancelKey+":notify").Err(); err != nil {
			return fmt.Errorf("cancel %s: %w", e, err)
		}
	}
	return nil
}

// refreshCancels reads the cancel epoch and reloads the cancel set when it
// moved since the last look, and reports the entries it did not hold to the watcher (so a
// request in flight is aborted even when the announcement was missed).
func (t *Transport) refreshCancels(ctx context.Context) error {
	epoch, err := t.client.Get(ctx, t.opts.CancelKey+":epoch").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read cancellations: %w", err)
	}
	return t.applyEpoch(ctx, epoch)
}

// applyEpoch reloads the cancel set unless epoch (as just read) is the one
// this copy was loaded at.
func (t *Transport) applyEpoch(ctx context.Context, epoch string) error {
	if t.cancels.Current(epoch) {
		return nil
	}
	return t.cancels.Reload(ctx, t.client, t.opts.CancelKey, epoch)
}

// Cancelled implements transport.CancelChecker: the request's job or id was
// cancelled through sluice (Cancel; checked against this replica's copy,
// reloaded by the claim that delivered it), or upstream's key
// request-cancel:<id> holds the request's token.
func (t *Transport) Cancelled(ctx context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	if t.cancels.Has(req) {
		return true, nil
	}
	return t.upCancel.Cancelled(ctx, req)
}

// WatchCancellations implements transport.CancelWatcher: it reports the
// cancellations announced on <cancel_key>:notify, and those a claim finds
// new, until ctx ends or the transport closes.
func (t *Transport) WatchCancellations(ctx context.Context, fn func(transport.Cancellation)) error {
	return t.cancels.Watch(ctx, t.client, t.opts.CancelKey+":notify", t.ctx.Done(), fn)
}

var (
	_ transport.CancelChecker = (*Transport)(nil)
	_ transport.CancelWatcher = (*Transport)(nil)
)
