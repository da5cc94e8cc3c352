package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Cancellations through sluice (a producer's Cancel, front/submit/redisstream)
// live in three keys named by the cancel_key option (default
// DefaultCancelKey): the sorted set <cancel_key> of entries "job:<job id>"
// and "req:<request id>" scored by when they are forgotten (Unix ms), the
// counter <cancel_key>:epoch, moved by every cancellation, and the channel
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

	jobEntry     = "job:"
	requestEntry = "req:"
)

// cancelScript records entry ARGV[1] in set KEYS[1] until ARGV[2] (Unix
// ms), forgets entries due before ARGV[3] (now), moves epoch KEYS[2] and
// announces the entry on channel ARGV[4].
var cancelScript = redis.NewScript(`
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('INCR', KEYS[2])
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
	var entries []string
	if ca.JobID != "" {
		entries = append(entries, jobEntry+ca.JobID)
	}
	if ca.RequestID != "" {
		entries = append(entries, requestEntry+ca.RequestID)
	}
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

// parseEntry turns "job:<id>" / "req:<id>" into a Cancellation.
func parseEntry(e string) (transport.Cancellation, bool) {
	switch {
	case strings.HasPrefix(e, jobEntry):
		return transport.Cancellation{JobID: e[len(jobEntry):]}, true
	case strings.HasPrefix(e, requestEntry):
		return transport.Cancellation{RequestID: e[len(requestEntry):]}, true
	}
	return transport.Cancellation{}, false
}

// cancelCache is this replica's copy of the cancel set, reloaded when a
// claim finds the epoch moved.
type cancelCache struct {
	mu      sync.RWMutex
	epoch   string
	loaded  bool
	entries map[string]struct{}
	fn      func(transport.Cancellation)
}

func (c *cancelCache) has(req *wire.Request) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if len(c.entries) == 0 {
		return false
	}
	if job := req.JobID(); job != "" {
		if _, ok := c.entries[jobEntry+job]; ok {
			return true
		}
	}
	_, ok := c.entries[requestEntry+req.ID]
	return ok
}

// add records entry and reports whether it is new.
func (c *cancelCache) add(entry string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[entry]; ok {
		return false
	}
	if c.entries == nil {
		c.entries = map[string]struct{}{}
	}
	c.entries[entry] = struct{}{}
	return true
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
	key := t.opts.CancelKey
	t.cancels.mu.RLock()
	same := t.cancels.loaded && t.cancels.epoch == epoch
	t.cancels.mu.RUnlock()
	if same {
		return nil
	}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	entries, err := t.client.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, ByScore: true, Start: now, Stop: "+inf"}).Result()
	if err != nil {
		return fmt.Errorf("read cancellations: %w", err)
	}
	fresh := make(map[string]struct{}, len(entries))
	var added []string
	t.cancels.mu.Lock()
	for _, e := range entries {
		fresh[e] = struct{}{}
		if _, ok := t.cancels.entries[e]; !ok {
			added = append(added, e)
		}
	}
	t.cancels.entries, t.cancels.epoch, t.cancels.loaded = fresh, epoch, true
	fn := t.cancels.fn
	t.cancels.mu.Unlock()
	if fn != nil {
		for _, e := range added {
			if c, ok := parseEntry(e); ok {
				fn(c)
			}
		}
	}
	return nil
}

// Cancelled implements transport.CancelChecker: the request's job or id was
// cancelled through sluice (Cancel; checked against this replica's copy,
// reloaded by the claim that delivered it), or upstream's key
// request-cancel:<id> holds the request's token.
func (t *Transport) Cancelled(ctx context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	if t.cancels.has(req) {
		return true, nil
	}
	return t.upCancel.Cancelled(ctx, req)
}

// WatchCancellations implements transport.CancelWatcher: it reports the
// cancellations announced on <cancel_key>:notify, and those a claim finds
// new, until ctx ends or the transport closes.
func (t *Transport) WatchCancellations(ctx context.Context, fn func(transport.Cancellation)) error {
	t.cancels.mu.Lock()
	t.cancels.fn = fn
	t.cancels.mu.Unlock()
	defer func() {
		t.cancels.mu.Lock()
		t.cancels.fn = nil
		t.cancels.mu.Unlock()
	}()
	ps := t.client.Subscribe(ctx, t.opts.CancelKey+":notify")
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			if c, ok := parseEntry(m.Payload); ok && t.cancels.add(m.Payload) {
				fn(c)
			}
		}
	}
}

var (
	_ transport.CancelChecker = (*Transport)(nil)
	_ transport.CancelWatcher = (*Transport)(nil)
)
