package status

import (
	"slices"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/pipeline"
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
	// pods is the history of the gate's per-pod readings (a
	// gate.PodReporter's), one sample per PodHistoryStep over
	// pipeline.HistorySpan, oldest first.
	pods []podSample
}

// PodHistoryStep is the least time between two samples of a gate's
// per-pod history (the refresh loop reports every reading; the page's
// chart needs one a second).
const PodHistoryStep = time.Second

// podSample is a gate's per-pod readings at one moment.
type podSample struct {
	at   time.Time
	pods []gate.PodReading
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
// arguments. After a query that worked it samples, at most once per
// PodHistoryStep, the per-pod readings of a gate that places requests on
// pods (gate.PodReporter, found through the gate's wrappers).
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
		return
	}
	if s.refresher == nil || (len(s.pods) > 0 && now.Sub(s.pods[len(s.pods)-1].at) < PodHistoryStep) {
		return
	}
	rep := gate.PodReporterOf(s.refresher.Gate())
	if rep == nil {
		return
	}
	if pods := rep.PodReadings(); len(pods) > 0 {
		s.pods = append(s.pods, podSample{at: now, pods: pods})
	}
	if k := slices.IndexFunc(s.pods, func(p podSample) bool { return now.Sub(p.at) <= pipeline.HistorySpan }); k > 0 {
		s.pods = slices.Delete(s.pods, 0, k)
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
	// Pods are, for a gate that places requests on pods (pool-headroom
	// with dispatch "pods": gate.PodReporter), each pod's figures of its
	// last reading and their history; omitted for any other gate.
	Pods []Pod `json:"pods,omitempty"`
}

// Pod is one pod's entry of a gate that places requests on pods.
type Pod struct {
	// Pod is the pod's base URL.
	Pod string `json:"pod"`
	// InFlight is the batch's calls on the pod (the gate's own); Limit the
	// most the gate allows there now.
	InFlight int `json:"in_flight"`
	Limit    int `json:"limit"`
	// Running and Waiting are the pod's gauges (all traffic); KV its
	// KV-cache usage (0 when the gate does not read it).
	Running int     `json:"running"`
	Waiting int     `json:"waiting"`
	KV      float64 `json:"kv"`
	// Burst: the gate sees a burst of other traffic on the pod.
	Burst bool `json:"burst,omitempty"`
	// History holds [at (Unix ms), in flight, limit] triples, one per
	// PodHistoryStep over the last 15 minutes, oldest first; the last
	// reading closes it.
	History [][3]float64 `json:"history"`
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

// snapshot returns the gate's entry as of now and its refresh loop (nil
// until SetRefresher).
func (s *GateState) snapshot(now time.Time) (Gate, *gate.Refresher) {
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
	hist := slices.Clone(s.pods)
	s.mu.Unlock()
	if r == nil {
		return g, nil
	}
	if rep := gate.PodReporterOf(r.Gate()); rep != nil {
		g.Pods = podEntries(rep.PodReadings(), hist, now)
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

// podEntries are the pods of the last reading, each with its history from
// hist (matched by URL) closed by the reading, taken at now.
func podEntries(last []gate.PodReading, hist []podSample, now time.Time) []Pod {
	if len(last) == 0 {
		return nil
	}
	out := make([]Pod, len(last))
	for i, p := range last {
		e := Pod{Pod: p.Pod, InFlight: p.InFlight, Limit: p.Limit, Running: p.Running, Waiting: p.Waiting, KV: p.KV, Burst: p.Burst,
			History: make([][3]float64, 0, len(hist)+1)}
		for _, h := range hist {
			if j := slices.IndexFunc(h.pods, func(q gate.PodReading) bool { return q.Pod == p.Pod }); j >= 0 {
				e.History = append(e.History, [3]float64{float64(h.at.UnixMilli()), float64(h.pods[j].InFlight), float64(h.pods[j].Limit)})
			}
		}
		e.History = append(e.History, [3]float64{float64(now.UnixMilli()), float64(p.InFlight), float64(p.Limit)})
		out[i] = e
	}
	return out
}
