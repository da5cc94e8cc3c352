package h2c

import (
	"net/http"
	"strings"
)

// maxCachedName is the longest header name cached: a gateway sending long
// random names must not pin memory in the cache.
const maxCachedName = 128

// lowerName returns a request header name in lower case, as HTTP/2 sends
// it, cached so that the names a dispatcher sends on every call cost no
// allocation.
func (t *Transport) lowerName(name string) string {
	if l, ok := t.lower.Load(name); ok {
		return l
	}
	l := strings.ToLower(name)
	if l == name || len(name) > maxCachedName {
		return l // already lower case (lowering it did not allocate), or too long to keep
	}
	// The name may be a caller's own string: keep a copy, not the caller's.
	return t.lower.Store(strings.Clone(name), l)
}

// canonicalName returns a response header name (lower case on the wire) in
// canonical form, as http.Header keys are, cached likewise.
func (t *Transport) canonicalName(name string) string {
	if c, ok := t.canon.Load(name); ok {
		return c
	}
	c := http.CanonicalHeaderKey(name)
	if c == name || len(name) > maxCachedName {
		return c
	}
	// name is the HPACK decoder's own string: it may be kept.
	return t.canon.Store(name, c)
}
