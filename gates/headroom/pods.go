package headroom

// Dispatch "pods": the gate places each batch request on a pod itself.
//
// With dispatch "gateway" (the default) the gate sees the pool as one
// number: it cannot tell on which pod its calls run (the gateway picks),
// so its reserve is pool-wide, a take-back hits the youngest call wherever
// it runs, and a call taken back resumes wherever the router sends it.
// With dispatch "pods" the queue's batch goes straight to the pods the
// gate reads (the interactive traffic stays on the gateway), and every
// rule of the gate applies per pod:
//
//	own_i     = calls placed on pod i (until the grace after their release)
//	others_i  = max(0, running_i + ceil(waiting_weight × waiting_i) − own_i)
//	held_i    = the highest others_i within hold
//	keep_i    = (burst_i ? reserve : idle_reserve) + ceil(reserve_share × held_i)
//	allowed_i = seats_per_pod − keep_i − held_i   (in a burst: at most own_i + 1)
//	budget    = Σ allowed_i / max_concurrency
//
// burst_i is pod i's own burst (its others_i reaching burst_threshold). A
// request is placed on a pod only while that pod has room (own_i <
// allowed_i), nothing waits there (no interactive request is queued
// behind the batch: waiting_i less this replica's placements since the
// previous reading, which wait for the pod's next step, is 0), fewer than pending_prefills of the
// queue's calls were placed there since the pod's last reading (each is a
// prefill the pod's next steps carry) and, with pace_tokens, the pace in
// tokens lets it (after a placement that brings P uncached prompt tokens,
// the next one waits P ÷ pace_tokens seconds, or P ÷ burst_pace_tokens
// while the pod is in its burst). Of the requests waiting
// for a pod, those due first are placed first (waiters.go). A request
// that was taken back goes to the pod it ran on (its tokens are in that
// pod's prefix cache: the resumed call redoes no prefill) and, while that
// pod does not qualify, waits for it (its claim keeps the pod's next place
// for it, earliest deadline first among the requests taken back from that
// pod) rather than prefill its prompt and tokens again elsewhere; any
// other request goes to the qualifying pod with the most room. When no pod qualifies it waits (its credit held)
// and asks again at the next reading, or sooner when only the pace held
// it. The evictor takes back, on each pod over allowed_i, the youngest
// calls there (gate.PodReporter).

import (
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// Dispatch modes.
const (
	// DispatchGateway sends the batch to the queue's gateway (default).
	DispatchGateway = "gateway"
	// DispatchPods places each batch request on a pod (see the file's notes).
	DispatchPods = "pods"
)

// DefaultPendingPrefills is how many calls may be placed on one pod
// between two readings of it.
const DefaultPendingPrefills = 1

// DefaultBytesPerToken is the payload bytes counted as one prompt token by
// the pace in tokens (pace_tokens).
const DefaultBytesPerToken = 4

// PodLabel is the request label naming the pod (its base URL) the gate
// last placed the request on; it travels with a request taken back, so
// that the request resumes where its tokens are cached.
const PodLabel = "sluice_pod"

// StepMetricNone as step_metric: the gate does not read the pods' steps.
const StepMetricNone = "none"

// ownWaitSteps is how many of a pod's steps a placement may wait at the
// pod before its first: it arrives during one step and is scheduled when
// the next begins (one step at most), plus a quarter step for its way
// there.
const ownWaitSteps = 1.25

// podGauges are one pod's gauges of one reading.
type podGauges struct {
	running, waiting int
	kv               float64
	steps            float64 // the pod's engine steps so far (step_metric)
	stepsOK          bool    // the pod exports them
}

// podState is what the gate keeps of one pod with dispatch "pods".
type podState struct {
	url   string // the pod's base URL: calls placed here go to url + the queue's path
	own   ledger
	peaks PeakHold
	rule  Rule
	// since counts the calls placed here since the pod's last reading.
	since int
	// placed are the times of the recent placements here, oldest first.
	placed []time.Time
	// steps and stepsAt are the pod's step count at the last reading
	// that had it and when that reading's scrape began; step is the
	// pod's mean step between its last two such readings (0: unknown).
	steps   float64
	stepsAt time.Time
	step    time.Duration
	// paced is when the pace in tokens (pace_tokens) lets the next call
	// be placed here.
	paced time.Time
	// claims are the requests taken back from this pod that wait for it
	// (their tokens are cached here): while one does, the pod's next
	// place is theirs, earliest deadline first.
	claims waiters
	last   PodReading
	// held is the peak of others this replica's own readings hold (what
	// it publishes to the other replicas; last.Held is the highest of it
	// and theirs).
	held int
}

// PodReading is what the last reading saw of one pod (dispatch "pods").
type PodReading struct {
	// URL is the pod's base URL.
	URL                         string
	Running, Waiting, Own       int
	Others, Held, Keep, Allowed int
	Burst                       bool
	KV                          float64
	// Queued are the requests waiting at the pod that this replica did
	// not place there lately: Waiting less this replica's placements
	// that may still wait for the pod's next step (the gauge counts every
	// request): those of the last one and a quarter steps before the scrape (Step), or
	// without the pods' steps (step_metric), those since the previous
	// reading. A pod where one is queued takes no batch.
	Queued int
	// Step is the pod's mean engine step between its last two readings
	// (0: not known).
	Step time.Duration

	// Peers are the other replicas' calls here (with an account), those
	// they released within the release grace included, PeersLive those
	// running now; Pooled is the limit for every replica's calls here
	// together (Allowed is this replica's part of it).
	Peers, PeersLive, Pooled int
}

// podURLs returns the base URLs the pods serve inference on: urls when
// given, else each endpoint with its last path element ("/metrics")
// removed, as vLLM serves both on one port.
func podURLs(endpoints, urls []string) ([]string, error) {
	if len(urls) > 0 {
		if len(urls) != len(endpoints) {
			return nil, fmt.Errorf("gate_params.pod_urls: %d URLs for %d endpoints, want one per endpoint in the same order", len(urls), len(endpoints))
		}
		for _, u := range urls {
			p, err := url.Parse(u)
			if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.RawQuery != "" || p.Fragment != "" {
				return nil, fmt.Errorf("gate_params.pod_urls: %q is not an http(s)://host[:port][/prefix] URL", u)
			}
		}
		return urls, nil
	}
	out := make([]string, len(endpoints))
	for i, e := range endpoints {
		base, ok := strings.CutSuffix(e, "/metrics")
		if !ok {
			return nil, fmt.Errorf("gate_params.endpoints: %q does not end in /metrics, so the pod's inference URL cannot be derived with dispatch %q: set gate_params.pod_urls", e, DispatchPods)
		}
		out[i] = base
	}
	return out, nil
}

// newPods returns the per-pod state for cfg (dispatch "pods").
func newPods(cfg Config) ([]*podState, error) {
	urls, err := podURLs(cfg.Endpoints, cfg.PodURLs)
	if err != nil {
		return nil, err
	}
	pods := make([]*podState, len(urls))
	for i, u := range urls {
		pods[i] = &podState{url: u, rule: Rule{Seats: cfg.SeatsPerPod, Reserve: *cfg.Reserve, IdleReserve: *cfg.IdleReserve,
			ReserveShare: cfg.ReserveShare,
			Burst:        Burst{Threshold: cfg.BurstThreshold, Window: cfg.BurstWindow, Growth: cfg.BurstGrowth}}}
	}
	return pods, nil
}

// readPods applies one reading to every pod and fills r's pool-wide sums;
// peers are the other replicas' calls per pod (see account.go). g.mu is
// held.
func (g *Gate) readPods(r *Reading, rd reading, peers Peers) {
	c := g.cfg
	g.waiting.sweep(r.At, g.staleWait())
	r.Pods = make([]PodReading, len(g.pods))
	for i, p := range g.pods {
		pg := rd.pods[i]
		pr := PodReading{URL: p.url, Running: pg.running, Waiting: pg.waiting, KV: pg.kv, Own: p.own.at(r.At, c.ReleaseGrace),
			Peers: at(peers.InFlight, i), PeersLive: at(peers.Live, i)}
		pr.Step = p.observeSteps(rd.start, pg)
		pr.Queued = max(0, pg.waiting-p.ownWaiting(rd.start))
		pr.Others = g.share.confirmed(i, g.others(pg.running, pg.waiting, pr.Own+pr.Peers), peers)
		// the replicas hold the highest peak any of them read, so that
		// they agree on the pod's limit (see account.go); without a hold
		// none is remembered, theirs included
		p.held = p.peaks.Held(r.At, c.Hold, pr.Others)
		pr.Held = p.held
		if c.Hold >= 0 {
			pr.Held = max(pr.Held, at(peers.Held, i))
		}
		kvCap := -1
		if c.KVLimit > 0 && pg.kv > c.KVLimit {
			kvCap = pr.Own + pr.Peers
			r.KVCap = max(0, r.KVCap) + kvCap
		}
		// in a burst the limit rises by one above what runs now (a call
		// that finished frees its seat for the next at once, as the
		// replay's twin does)
		pr.Burst, pr.Keep, pr.Pooled = p.rule.Apply(r.At, pr.Others, pr.Held, p.own.live()+pr.PeersLive, kvCap)
		// split by the calls running now: a call released within the
		// grace has left its seat (or is leaving it, taken back), and
		// counted in the split it made an excess that nobody's calls
		// made, which a replica took back a call for (see account.go)
		pr.Allowed = share(pr.Pooled, p.own.live(), peers, i)
		p.since, p.last = 0, pr
		r.Pods[i] = pr
		r.Own += pr.Own
		r.Peers += pr.Peers
		r.Others += pr.Others
		r.Held += pr.Held
		r.Keep += pr.Keep
		r.Allowed += pr.Allowed
		r.Burst = r.Burst || pr.Burst
	}
}

// observeSteps notes the pod's step count of a reading whose scrape began
// at start and returns the pod's mean step since the last reading that
// had it (the last one known while the pod took no step).
func (p *podState) observeSteps(start time.Time, pg podGauges) time.Duration {
	switch {
	case !pg.stepsOK:
		p.step, p.stepsAt = 0, time.Time{}
	case p.stepsAt.IsZero() || pg.steps < p.steps: // the first reading, or the pod restarted
		p.steps, p.stepsAt = pg.steps, start
	case pg.steps > p.steps && start.After(p.stepsAt):
		p.step = time.Duration(float64(start.Sub(p.stepsAt)) / (pg.steps - p.steps))
		p.steps, p.stepsAt = pg.steps, start
	}
	return p.step
}

// ownWaiting is how many of this replica's placements on the pod may
// still wait at it for their first step, as of a scrape that began at
// start: those placed within ownWaitSteps steps before start or since;
// with the pod's step not known, those since the previous reading. It
// forgets the placements older than that window.
func (p *podState) ownWaiting(start time.Time) int {
	if p.step <= 0 {
		p.placed = p.placed[:0]
		return p.since
	}
	from := start.Add(-time.Duration(ownWaitSteps * float64(p.step)))
	k := 0
	for k < len(p.placed) && !p.placed[k].After(from) {
		k++
	}
	p.placed = p.placed[k:]
	return len(p.placed)
}

// place picks the pod for req (see the file's notes) and labels req with
// it. When no pod takes it, place returns nil, why, and when to ask again
// (the next reading, or sooner when only the pace in tokens held it); a
// request taken back from a pod that cannot take it now waits for that
// pod, where its tokens are cached, rather than prefill again on another,
// and the pod keeps its next place for it. Among the requests waiting for a pod, those
// due first are placed first (see waiters.go). g.mu is held.
func (g *Gate) place(req *wire.Request) (pod *podState, why string, retry time.Duration) {
	now := g.now()
	var best, cached *podState
	bestRoom := 0
	full, waiting, pending, paced, claimed, slots := 0, 0, 0, 0, 0, 0
	retry = g.cfg.RefreshInterval
	w := waiterOf(req)
	prev := ""
	var prevPod *podState
	if req != nil {
		prev = req.Label(PodLabel)
	}
	for _, p := range g.pods {
		if p.url == prev {
			prevPod = p
		}
		room := p.last.Allowed - p.own.live()
		switch {
		case room <= 0:
			full++
			continue
		case p.last.Queued > 0:
			waiting++
			continue
		case p.since >= g.cfg.PendingPrefills:
			pending++
			continue
		case now.Before(p.paced):
			paced++
			retry = min(retry, p.paced.Sub(now))
			continue
		}
		// what this pod can take now: one request with the pace in
		// tokens, else its room up to the placements left this reading
		n := min(room, g.cfg.PendingPrefills-p.since)
		if g.cfg.PaceTokens > 0 {
			n = 1
		}
		if p.claims.holds(w, now, g.staleWait(), n) {
			claimed++ // kept for requests taken back from it
			continue
		}
		slots += n
		if p.url == prev { // where its tokens are cached
			cached = p
		}
		if room > bestRoom {
			best, bestRoom = p, room
		}
	}
	switch {
	case prevPod != nil && cached == nil:
		// it waits for its pod, which keeps its next place for it
		g.waiting.done(w)
		if w.id != "" {
			prevPod.claims.ahead(w, now, g.staleWait(), 0)
		}
		return nil, "waiting for the pod its tokens are cached on: " + prev, g.cfg.RefreshInterval
	case best == nil:
		if w.id != "" {
			g.waiting.ahead(w, now, g.staleWait(), 0) // remembered: it waits
		}
		return nil, fmt.Sprintf("no pod has room: %d full, %d with requests waiting, %d with a placement not read yet, %d paced, %d kept for requests taken back from it", full, waiting, pending, paced, claimed), retry
	case cached == nil && w.id != "" && !g.waiting.ahead(w, now, g.staleWait(), slots):
		return nil, fmt.Sprintf("%d pod(s) can take a request now and as many requests due earlier wait for them", slots), retry
	}
	if cached != nil {
		best = cached
		best.claims.done(w)
	}
	g.waiting.done(w)
	best.since++
	best.placed = append(best.placed, now)
	if pace := g.pace(best); pace > 0 {
		best.paced = now.Add(time.Duration(float64(g.uncached(req, best)) / pace * float64(time.Second)))
	}
	if req != nil {
		req.SetLabel(PodLabel, best.url)
	}
	return best, "", 0
}

// pace is pod p's pace in tokens now (0: none): burst_pace_tokens while
// the pod's last reading fell in its burst, else pace_tokens. g.mu is held.
func (g *Gate) pace(p *podState) float64 {
	if p.last.Burst && g.cfg.BurstPaceTokens > 0 {
		return g.cfg.BurstPaceTokens
	}
	return g.cfg.PaceTokens
}

// staleWait is how long a waiting request may go without asking before
// it is forgotten. g.mu is held.
func (g *Gate) staleWait() time.Duration { return staleWaits * g.cfg.RefreshInterval }

// uncached estimates the prompt tokens req brings to pod p's prefill: none
// when it resumes on the pod it ran on (its tokens are in that pod's
// prefix cache), else its payload's size in tokens (bytes_per_token).
func (g *Gate) uncached(req *wire.Request, p *podState) int {
	if req == nil {
		return 0
	}
	if req.Label(PodLabel) == p.url {
		return 0
	}
	return int(math.Ceil(float64(len(req.Payload)) / g.cfg.BytesPerToken))
}
