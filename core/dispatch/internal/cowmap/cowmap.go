// Package cowmap is a bounded copy-on-write map for the caches on dispatch's
// per-call path (parsed targets and endpoints, header names, h2c routes):
// reads are lock-free and do not allocate; writes copy the map, which suits
// the few, rarely added keys these caches hold.
package cowmap

import (
	"sync"
	"sync/atomic"
)

// Map is a bounded copy-on-write map. The zero value holds nothing and takes
// nothing (Max 0); set Max before the first Store. Safe for concurrent use.
type Map[K comparable, V any] struct {
	// Max is the most keys the map holds; past it, Store keeps nothing.
	Max int

	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

// Load returns the value stored for k.
func (c *Map[K, V]) Load(k K) (V, bool) {
	if m := c.m.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// Store adds k unless it is present or the map is full, and returns the
// value now associated with k (v itself when the map is full).
func (c *Map[K, V]) Store(k K, v V) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	n := 0
	if old != nil {
		if e, ok := (*old)[k]; ok {
			return e
		}
		n = len(*old)
	}
	if n >= c.Max {
		return v
	}
	m := make(map[K]V, n+1)
	if old != nil {
		for ok, ov := range *old {
			m[ok] = ov
		}
	}
	m[k] = v
	c.m.Store(&m)
	return v
}

// Len returns how many keys the map holds.
func (c *Map[K, V]) Len() int {
	if m := c.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}
