package submit

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/sluice-io/sluice/core/registry"
	"github.com/sluice-io/sluice/core/transport"
)

// Factory is a transport's producer side as it registers: the capability
// of a transport to take requests from the fronts.
type Factory struct {
	// New builds a producer from the transport's options and env (those
	// the transport's own factory gets), putting requests where that
	// transport reads them. It must reject unknown options. When the
	// producer reaches the queues only through a transport of its own (the
	// memory transport's in-process queues), New returns that transport
	// too, and the dispatcher must run on it; otherwise the transport is
	// nil.
	New func(options json.RawMessage, env transport.Env) (Producer, transport.Transport, error)
	// Check, when set, tells without I/O that options cannot serve a
	// producer (`sluice validate` reports it); New refuses them too.
	Check func(options json.RawMessage) error
}

// Registry maps transport names to their producers' factories: the
// "transport producer" namespace of the generic registry (Register,
// Lookup, Has, Names), plus New and Check. A transport without a producer
// has no entry.
type Registry struct {
	*registry.Registry[Factory]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{registry.New[Factory]("transport producer")}
}

// Register adds f as the producer of transport name; f.New is required.
func (r *Registry) Register(name string, f Factory) error {
	if f.New == nil {
		return fmt.Errorf("register %s %q: nil factory", r.Namespace(), name)
	}
	return r.Registry.Register(name, f)
}

// New builds the producer of transport name (a nil env.Logger discards
// the logs); see Factory.New for the transport it may return.
func (r *Registry) New(name string, options json.RawMessage, env transport.Env) (Producer, transport.Transport, error) {
	f, err := r.Lookup(name)
	if err != nil {
		return nil, nil, err
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	p, t, err := f.New(options, env)
	if err != nil {
		return nil, nil, fmt.Errorf("%s producer: %w", name, err)
	}
	return p, t, nil
}

// Check runs the Check of transport name's producer on options: nil when
// it has none, an error when name has no producer.
func (r *Registry) Check(name string, options json.RawMessage) error {
	f, err := r.Lookup(name)
	if err != nil || f.Check == nil {
		return err
	}
	return f.Check(options)
}
