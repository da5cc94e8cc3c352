// Package status is sluice's live status page, served on the metrics port:
// GET / is one self-contained HTML page (inline CSS, JavaScript and SVG; no
// external asset, and a Content-Security-Policy that forbids any) that
// fetches GET /status.json every two seconds and draws it: per queue its
// depth in the broker, in flight against its limits, delayed and
// dead-lettered requests, results by code with the throughput of the last
// minute, its gate budget over the last 15 minutes, whether its eviction
// is suspended and, for a gate that places requests on pods
// (gate.PodReporter), the batch in flight on each pod over the same span;
// the worker pools; the gates (and the state of plugin gates); the
// process; and the embedding program's own figures under "Also" (Extra),
// with their charts.
//
// The figures come from the pipeline (pipeline.Pipeline.Snapshot, whose
// history the gauges sampler keeps: nothing runs per message for the page)
// and from the gates' refresh loops (Gates, which also sample the per-pod
// history). core/app registers the handler on the metrics mux, behind the
// same guard as /metrics.
package status

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/pipeline"
)

//go:embed page.html
var page []byte

// CSP is the Content-Security-Policy of the page: its own inline style and
// script, fetches to its own origin, nothing else.
const CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Source is what the page reads: *pipeline.Pipeline is one.
type Source interface {
	Snapshot() pipeline.Snapshot
}

var _ Source = (*pipeline.Pipeline)(nil)

// Config configures a Page.
type Config struct {
	// Pipeline is read for every snapshot (required).
	Pipeline Source
	// Gates are the deployment's gates (nil: none shown).
	Gates *Gates
	// Transport is the deployment's transport name.
	Transport string
	// Version is sluice's version (default: the main module's version from
	// the build information, else "dev").
	Version string
	// Started is when the deployment started (default: when New ran).
	Started time.Time
	// Extra, when set, is asked for figures of the embedding program's own
	// at every snapshot (the demo shows interactive TTFT against its floor);
	// the page lists them under "Also" in the order given, and draws the
	// chart of each figure that has one.
	Extra func() []Figure
}

// Figure is one figure an embedding program adds to the page.
type Figure struct {
	Label string `json:"label"`
	Value string `json:"value"`
	// Chart, when set, is the figure over time: the page draws it as the
	// budget chart is drawn, above the table of figures. The program keeps
	// the history (the page keeps none of it).
	Chart *Chart `json:"chart,omitempty"`
}

// Chart is a figure's history: one or more lines over time, on one
// y-axis from 0 (the page scales it to the highest point).
type Chart struct {
	// Unit is the y-axis's unit ("ms").
	Unit string `json:"unit"`
	// Lines are drawn in order, the first in the accent colour, the
	// others dashed (a reference such as a floor).
	Lines []Line `json:"lines"`
}

// Line is one line of a Chart.
type Line struct {
	Label string `json:"label"`
	// Points holds [at (Unix ms), value] pairs, oldest first.
	Points [][2]float64 `json:"points"`
}

// Page serves the status page and its JSON.
type Page struct {
	cfg Config
	pid int
}

// New returns the page of cfg.
func New(cfg Config) *Page {
	if cfg.Version == "" {
		cfg.Version = buildVersion()
	}
	if cfg.Started.IsZero() {
		cfg.Started = time.Now()
	}
	return &Page{cfg: cfg, pid: os.Getpid()}
}

func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Snapshot is the content of /status.json. Times are Unix milliseconds of
// the server's clock (the page computes ages from Now, so a skewed browser
// clock does not matter).
type Snapshot struct {
	Now     int64   `json:"now"`
	Process Process `json:"process"`
	Queues  []Queue `json:"queues"`
	Pools   []Pool  `json:"pools"`
	Gates   []Gate  `json:"gates"`
	// HistorySpanMs and RateWindowMs are the spans of the budget history
	// and of the throughput.
	HistorySpanMs int64 `json:"history_span_ms"`
	RateWindowMs  int64 `json:"rate_window_ms"`
	// Extra holds the embedding program's figures (Config.Extra); omitted
	// when there are none.
	Extra []Figure `json:"extra,omitempty"`
}

// Process is the process's entry.
type Process struct {
	Version   string `json:"version"`
	Go        string `json:"go"`
	PID       int    `json:"pid"`
	Started   int64  `json:"started"`
	UptimeS   int64  `json:"uptime_s"`
	Transport string `json:"transport"`
}

// Queue is one queue's entry (see pipeline.QueueSnapshot for the meanings).
type Queue struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Transport  string `json:"transport"`
	WorkerPool string `json:"worker_pool"`
	// Gate is the name of the queue's gate (an entry of Snapshot.Gates).
	Gate string `json:"gate"`
	// Waiting, Delayed and DeadLetterHeld are null when the broker does
	// not tell them.
	Waiting        *int64            `json:"waiting"`
	Delayed        *int64            `json:"delayed"`
	DeadLetterHeld *int64            `json:"dead_letter_held"`
	DepthAt        int64             `json:"depth_at,omitempty"`
	Claimed        int               `json:"claimed"`
	Limit          int               `json:"limit"`
	Max            int               `json:"max"`
	Calls          int               `json:"calls"`
	Budget         float64           `json:"budget"`
	Results        map[string]uint64 `json:"results"`
	Total          uint64            `json:"total"`
	DeadLettered   uint64            `json:"dead_lettered"`
	// Throughput is results per second over the last minute.
	Throughput float64 `json:"throughput"`
	// BudgetHistory holds [at (Unix ms), budget] pairs, oldest first.
	BudgetHistory [][2]float64 `json:"budget_history"`
	// Evict is "" (the queue does not evict), "on" or "suspended"; a
	// suspension carries what the gate saw and when eviction is tried
	// again (Unix ms).
	Evict       string `json:"evict,omitempty"`
	EvictReason string `json:"evict_reason,omitempty"`
	EvictUntil  int64  `json:"evict_until,omitempty"`
}

// Pool is one worker pool's entry.
type Pool struct {
	ID       string `json:"id"`
	Workers  int    `json:"workers"`
	InFlight int    `json:"in_flight"`
	Waiting  int    `json:"waiting"`
	Lanes    bool   `json:"lanes"`
	Gate     string `json:"gate,omitempty"`
}

// Snapshot returns the figures now.
func (p *Page) Snapshot() Snapshot {
	ps := p.cfg.Pipeline.Snapshot()
	now := ps.At
	s := Snapshot{
		Now: now.UnixMilli(),
		Process: Process{
			Version: p.cfg.Version, Go: runtime.Version(), PID: p.pid, Transport: p.cfg.Transport,
			Started: p.cfg.Started.UnixMilli(), UptimeS: int64(now.Sub(p.cfg.Started) / time.Second),
		},
		Queues:        make([]Queue, 0, len(ps.Queues)),
		Pools:         make([]Pool, 0, len(ps.Pools)),
		HistorySpanMs: pipeline.HistorySpan.Milliseconds(),
		RateWindowMs:  pipeline.RateWindow.Milliseconds(),
	}
	names := map[*gate.Refresher]string{}
	for _, st := range p.cfg.Gates.states() {
		g, r := st.snapshot(now)
		s.Gates = append(s.Gates, g)
		if r != nil {
			names[r] = g.Name
		}
	}
	if s.Gates == nil {
		s.Gates = []Gate{}
	}
	for _, q := range ps.Queues {
		e := Queue{
			ID: q.ID, Name: q.Name, Transport: p.cfg.Transport, WorkerPool: q.WorkerPool, Gate: names[q.Gate],
			Claimed: q.Claimed, Limit: q.Limit, Max: q.Max, Calls: q.Calls, Budget: q.Budget,
			Results: q.Results, Total: q.Total, DeadLettered: q.DeadLettered, Throughput: q.Throughput,
			BudgetHistory: make([][2]float64, 0, len(q.BudgetHistory)+1),
		}
		e.Evict, e.EvictReason = q.Evict, q.EvictReason
		if !q.EvictUntil.IsZero() {
			e.EvictUntil = q.EvictUntil.UnixMilli()
		}
		if !q.DepthAt.IsZero() {
			e.Waiting, e.Delayed, e.DeadLetterHeld = known(q.Waiting), known(q.Delayed), known(q.DeadLetterHeld)
			e.DepthAt = q.DepthAt.UnixMilli()
		}
		for _, b := range q.BudgetHistory {
			e.BudgetHistory = append(e.BudgetHistory, [2]float64{float64(b.At.UnixMilli()), b.Budget})
		}
		// The budget in force now closes the line.
		e.BudgetHistory = append(e.BudgetHistory, [2]float64{float64(s.Now), q.Budget})
		s.Queues = append(s.Queues, e)
	}
	for _, pl := range ps.Pools {
		s.Pools = append(s.Pools, Pool{ID: pl.ID, Workers: pl.Workers, InFlight: pl.InFlight, Waiting: pl.Waiting, Lanes: pl.Lanes, Gate: names[pl.Gate]})
	}
	if p.cfg.Extra != nil {
		s.Extra = p.cfg.Extra()
	}
	return s
}

// known is n, or nil for a count the broker does not tell (-1).
func known(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

// ServeHTTP serves the page at "/" and the snapshot at "/status.json"
// (anything else is 404). Register it on both paths.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	switch r.URL.Path {
	case "/":
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", CSP)
		h.Set("Referrer-Policy", "no-referrer")
		_, _ = w.Write(page)
	case "/status.json":
		h.Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p.Snapshot())
	default:
		http.NotFound(w, r)
	}
}
