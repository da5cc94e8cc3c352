// Package cancelset is a replica's copy of the cancellations recorded
// through sluice, as the Redis transports that record them keep it:
// redis-sortedset (P:cancelled, written by its producer's CancelJob and
// CancelRequest) and redis-stream (<cancel_key>, written by its Cancel).
//
// In Redis the cancellations are a sorted set of entries "job:<job id>" and
// "req:<request id>" scored by when they are forgotten (Unix ms), an epoch
// counter that every change of the set moves (a cancellation sent again
// does not), and a pub/sub channel that announces each entry. A transport reads the epoch as its claims go and
// reloads its copy (Set.Reload) when the epoch moved, so a request claimed
// after a cancellation was recorded is checked against it (Set.Has) without
// a round trip per request; Set.Watch reports the announced entries, and a
// reload reports those the copy did not hold, so requests in flight are
// aborted even when an announcement was missed.
//
// What differs between the transports stays in them: the key names, where
// the epoch is read (a claim script's reply, a GET pipelined with a read,
// or a GET of its own) and the scripts that record a cancellation.
package cancelset

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Set is a replica's copy of the cancel set, the epoch it was loaded at,
// and the watcher its changes are reported to. The zero Set is empty and
// not loaded; it is safe for concurrent use and must not be copied.
type Set struct {
	// ReportRepeats makes Watch report every entry announced, also one the
	// copy already holds, so a cancellation announced again aborts again
	// what is in flight (redis-sortedset); without it Watch reports only
	// entries new to the copy (redis-stream). Set it before the Set is
	// used.
	ReportRepeats bool

	mu      sync.RWMutex
	epoch   string
	loaded  bool
	entries map[string]struct{}
	fn      func(transport.Cancellation)
}

// Has reports whether the copy cancels req: its job (metadata job_id) or
// its id.
func (s *Set) Has(req *wire.Request) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.entries) == 0 {
		return false
	}
	if job := req.JobID(); job != "" {
		if _, ok := s.entries[JobEntry(job)]; ok {
			return true
		}
	}
	_, ok := s.entries[RequestEntry(req.ID)]
	return ok
}

// Current reports whether the copy was loaded at epoch (false before the
// first load), that is whether a reload at epoch can be skipped.
func (s *Set) Current(epoch string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.loaded && s.epoch == epoch
}

// Reload reads the entries of the sorted set key that are not yet
// forgotten (score from now on) through c and installs them as the copy
// at epoch (Replace).
func (s *Set) Reload(ctx context.Context, c redis.Cmdable, key, epoch string) error {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	entries, err := c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, ByScore: true, Start: now, Stop: "+inf"}).Result()
	if err != nil {
		return fmt.Errorf("read cancellations: %w", err)
	}
	s.Replace(epoch, entries)
	return nil
}

// Replace makes entries the copy, loaded at epoch, and reports to the
// watcher (Watch's fn, when one runs) each entry the copy did not hold
// before, after the copy is replaced and outside its lock.
func (s *Set) Replace(epoch string, entries []string) {
	fresh := make(map[string]struct{}, len(entries))
	var added []string
	s.mu.Lock()
	for _, e := range entries {
		fresh[e] = struct{}{}
		if _, ok := s.entries[e]; !ok {
			added = append(added, e)
		}
	}
	s.entries, s.epoch, s.loaded = fresh, epoch, true
	fn := s.fn
	s.mu.Unlock()
	if fn == nil {
		return
	}
	for _, e := range added {
		if c, ok := Parse(e); ok {
			fn(c)
		}
	}
}

// add records entry and reports whether it is new.
func (s *Set) add(entry string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[entry]; ok {
		return false
	}
	if s.entries == nil {
		s.entries = map[string]struct{}{}
	}
	s.entries[entry] = struct{}{}
	return true
}

// Subscriber opens a pub/sub subscription (a go-redis client does).
type Subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Watch makes fn the Set's watcher, subscribes to channel through c, and
// until ctx ends, closed is closed or the subscription ends, records each
// entry announced there in the copy and reports it to fn (only when new
// to the copy unless ReportRepeats). While it runs, Replace reports to fn
// too (a Replace that took fn just before Watch returned may still call
// it). It returns nil. One Watch runs at a time: a second replaces the
// first's fn.
func (s *Set) Watch(ctx context.Context, c Subscriber, channel string, closed <-chan struct{}, fn func(transport.Cancellation)) error {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.fn = nil
		s.mu.Unlock()
	}()
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-closed:
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			ca, ok := Parse(m.Payload)
			if !ok {
				continue
			}
			if s.add(m.Payload) || s.ReportRepeats {
				fn(ca)
			}
		}
	}
}
