// Package registry is the one registry sluice's assembly builds adapters
// from: a namespace ("transport", "gate type", ...) that maps names to
// factories, in the manner of Caddy's modules. Registration is explicit (no
// init side effects): a program registers the adapters it links, in one
// place. An empty name, a nil factory and a name registered twice are
// errors; looking up an unknown name is an error that lists the known ones.
//
// The factory type F is the namespace's own (a transport factory, a gate
// factory), so each namespace keeps its typed constructor around Lookup:
// see core/transport.Registry and core/gate.Registry.
package registry

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
)

// Registry maps names to factories of type F within one namespace. Its
// methods are safe for concurrent use; the zero value is not usable (use New).
type Registry[F any] struct {
	namespace string
	mu        sync.RWMutex
	entries   map[string]F
}

// New returns an empty registry. namespace names what it holds in every
// message, e.g. "transport" gives `unknown transport "kafka" (known: memory)`.
func New[F any](namespace string) *Registry[F] {
	return &Registry[F]{namespace: namespace, entries: map[string]F{}}
}

// Namespace returns the namespace given to New.
func (r *Registry[F]) Namespace() string { return r.namespace }

// Register adds factory f under name. An empty name, a nil f and a name
// already registered are errors, and leave the registry as it was.
func (r *Registry[F]) Register(name string, f F) error {
	switch {
	case name == "":
		return fmt.Errorf("register %s: empty name", r.namespace)
	case isNil(f):
		return fmt.Errorf("register %s %q: nil factory", r.namespace, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.entries[name]; dup {
		return fmt.Errorf("register %s %q: already registered", r.namespace, name)
	}
	r.entries[name] = f
	return nil
}

// Lookup returns the factory registered under name, or an error naming the
// known names.
func (r *Registry[F]) Lookup(name string) (F, error) {
	r.mu.RLock()
	f, ok := r.entries[name]
	r.mu.RUnlock()
	if !ok {
		return f, fmt.Errorf("unknown %s %q (known: %s)", r.namespace, name, strings.Join(r.Names(), ", "))
	}
	return f, nil
}

// Has reports whether name is registered.
func (r *Registry[F]) Has(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.entries[name]
	return ok
}

// Names lists the registered names, sorted.
func (r *Registry[F]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.entries))
	for n := range r.entries {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// isNil reports whether f is nil: a nil interface, or a nil func, pointer,
// map, slice or channel.
func isNil(f any) bool {
	if f == nil {
		return true
	}
	switch v := reflect.ValueOf(f); v.Kind() {
	case reflect.Func, reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}
