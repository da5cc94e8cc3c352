package status

import (
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/gate"
)

// Gates records the state of a deployment's gates as their refresh loops
// report it (the same reports that set sluice_gate_budget,
// sluice_gate_failing and sluice_gate_failures_total). The zero value is
// an empty record; a nil *Gates records nothing.
type Gates struct {
	mu   sync.Mutex
	list []*GateState
}

// NewGates returns an empty record.
func NewGates() *Gates { return &Gates{} }

// Add records a gate named name (its name in metrics) of type typ, and
// returns the state its refresh loop reports to through Observe. On a nil
// *Gates it returns nil, whose methods do nothing.
func (g *Gates) Add(name, typ string) *GateState {
	if g == nil {
		return nil
	}
	st := &GateState{name: name, typ: typ}
	g.mu.Lock()
	g.list = append(g.list, st)
	g.mu.Unlock()
	return st
}

// states returns the recorded gates, in the order they were added.
func (g *Gates) states() []*GateState {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*GateState(nil), g.list...)
}

// GateState is one gate's state.
type GateState struct {
	name, typ string

	mu        sync.Mutex
	refresher *gate.Refresher
	observed  bool
	failing   bool
	failures  uint64
	lastErr   string
	lastErrAt time.Time
	since     time.Time // of the current failing state
}

// SetRefresher names the gate's refresh loop (the queues' snapshots name
// their gate by it).
func (s *GateState) SetRefresher(r *gate.Refresher) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.refresher = r
	s.mu.Unlock()
}

// Observe records one budget query: gate.RefresherConfig.Observe's
// arguments.
func (s *GateState) Observe(_ float64, err error) {
	if s == nil {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	failing := err != nil
	if !s.observed || failing != s.failing {
		s.since = now
	}
	s.observed, s.failing = true, failing
	if failing {
		s.failures++
		s.lastErr, s.lastErrAt = err.Error(), now
	}
}

// pider is what a plugin gate (plugins/host) tells of its process: its
// pid, 0 when none runs.
type pider interface{ PID() int }

// Gate is one gate's entry in the snapshot.
type Gate struct {
	// Name is the gate's name in metrics (the gate label).
	Name string `json:"name"`
	// Type is its gate_type ("plugin" for a plugin gate).
	Type string `json:"type"`
	// Budget is the budget in force.
	Budget float64 `json:"budget"`
	// State is "ok", "failing" (sluice_gate_failing is 1: the last budget
	// query failed and the failure policy is in force) or "starting" (not
	// asked yet).
	State string `json:"state"`
	// Since is when the gate entered State (Unix ms; 0 when not asked yet).
	Since int64 `json:"since,omitempty"`
	// Failures counts the failed budget queries (sluice_gate_failures_total).
	Failures uint64 `json:"failures"`
	// LastError is the last query's failure (it names a plugin, and says
	// when the next start of a lost plugin is due); LastErrorAt is when.
	LastError   string `json:"last_error,omitempty"`
	LastErrorAt int64  `json:"last_error_at,omitempty"`
	// Plugin is set for a plugin gate.
	Plugin *Plugin `json:"plugin,omitempty"`
}

// Plugin is what the page can tell of a plugin gate's process. The host
// (plugins/host) exposes only the pid of the process it runs; whether it
// restarts or failed for good is told by the gate's state and last error.
type Plugin struct {
	// PID is the plugin process id, 0 when none runs.
	PID int `json:"pid"`
	// State is "running" (a process runs and the gate answers), "failing"
	// (the gate's queries fail: the plugin is lost and restarts after its
	// backoff, or refused its parameters for good; LastError says which),
	// or "not running" (not started yet).
	State string `json:"state"`
}

// snapshot returns the gate's entry and its refresh loop (nil until
// SetRefresher).
func (s *GateState) snapshot() (Gate, *gate.Refresher) {
	s.mu.Lock()
	g := Gate{Name: s.name, Type: s.typ, Failures: s.failures, LastError: s.lastErr, State: "starting"}
	r := s.refresher
	if s.observed {
		g.State, g.Since = "ok", s.since.UnixMilli()
		if s.failing {
			g.State = "failing"
		}
	}
	if !s.lastErrAt.IsZero() {
		g.LastErrorAt = s.lastErrAt.UnixMilli()
	}
	s.mu.Unlock()
	if r == nil {
		return g, nil
	}
	g.Budget = r.Budget()
	if pg, ok := unwrapPlugin(r.Gate()); ok {
		p := &Plugin{PID: pg.PID(), State: "not running"}
		switch {
		case g.State == "failing":
			p.State = "failing"
		case p.PID > 0:
			p.State = "running"
		}
		g.Plugin = p
	}
	return g, r
}

// unwrapPlugin finds a plugin gate under the wrappers the gate registry
// adds (gate.Registry.New wraps a gate whose generic parameters are set).
func unwrapPlugin(g gate.Gate) (pider, bool) {
	for range 8 {
		if p, ok := g.(pider); ok {
			return p, true
		}
		u, ok := g.(interface{ Unwrap() gate.Gate })
		if !ok {
			return nil, false
		}
		g = u.Unwrap()
	}
	return nil, false
}
