package redissortedset

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// cancelCache is this replica's copy of the cancellations (P:cancelled),
// refreshed whenever a claim sees the cancel epoch move, so a request
// claimed after a cancellation was recorded is always checked against it,
// without a round trip per request.
type cancelCache struct {
	mu      sync.RWMutex
	epoch   string
	entries map[string]struct{}
	fn      func(transport.Cancellation)
}

func (c *cancelCache) currentEpoch() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.epoch
}

func (c *cancelCache) has(entry string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.entries[entry]
	return ok
}

func (c *cancelCache) empty() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries) == 0
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

// parseEntry turns "job:<id>" / "req:<id>" into a Cancellation.
func parseEntry(e string) (transport.Cancellation, bool) {
	switch {
	case strings.HasPrefix(e, keys.JobEntry):
		return transport.Cancellation{JobID: e[len(keys.JobEntry):]}, true
	case strings.HasPrefix(e, keys.RequestEntry):
		return transport.Cancellation{RequestID: e[len(keys.RequestEntry):]}, true
	}
	return transport.Cancellation{}, false
}

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
		if e == t.cancels.currentEpoch() {
			return
		}
		epoch = e
	}
	now := time.Now().UnixMilli()
	entries, err := t.client.ZRangeArgs(ctx, redis.ZRangeArgs{Key: t.names.Cancelled(), ByScore: true, Start: strconv.FormatInt(now, 10), Stop: "+inf"}).Result()
	if err != nil {
		t.log.Warn("reading cancellations failed", "err", err)
		return
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
	t.cancels.entries = fresh
	t.cancels.epoch = epoch
	fn := t.cancels.fn
	t.cancels.mu.Unlock()
	if fn != nil {
		for _, e := range added {
			if c, ok := parseEntry(e); ok {
				fn(c)
			}
		}
	}
}

// Cancelled implements transport.CancelChecker: the request's job or id was
// cancelled through sluice (checked against the replica's copy, kept
// current by every claim), or upstream's key request-cancel:<id> holds the
// request's token.
func (t *Transport) Cancelled(ctx context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	if !t.cancels.empty() {
		if job := req.JobID(); job != "" && t.cancels.has(keys.JobEntry+job) {
			return true, nil
		}
		if t.cancels.has(keys.RequestEntry + req.ID) {
			return true, nil
		}
	}
	return t.upCancel.Cancelled(ctx, req)
}

// WatchCancellations implements transport.CancelWatcher: it reports the
// cancellations announced on P:cancel, and those a claim or the periodic
// refresh finds new, until ctx ends.
func (t *Transport) WatchCancellations(ctx context.Context, fn func(transport.Cancellation)) error {
	t.cancels.mu.Lock()
	t.cancels.fn = fn
	t.cancels.mu.Unlock()
	defer func() {
		t.cancels.mu.Lock()
		t.cancels.fn = nil
		t.cancels.mu.Unlock()
	}()
	ps := t.client.Subscribe(ctx, t.names.CancelChannel())
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.closing:
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			t.cancels.add(m.Payload)
			if c, ok := parseEntry(m.Payload); ok {
				fn(c)
			}
		}
	}
}
