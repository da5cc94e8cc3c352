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
// allowed_i), nothing waits there (waiting_i = 0: no interactive request
// is queued behind the batch) and fewer than pending_prefills of the
// queue's calls were placed there since the pod's last reading (each is a
// prefill the pod's next steps carry). A request that was taken back goes
// to the pod it ran on (its tokens are in that pod's prefix cache: the
// resumed call redoes no prefill) and, while that pod does not qualify,
// goes back to the queue for a reading (Defer: its credit freed for the
// other pods) rather than prefill its prompt and tokens again elsewhere;
// any other request goes to the qualifying pod with the most room. When no
// pod qualifies it waits (its credit held) and asks again at the next
// reading. The evictor takes back, on
// each pod over allowed_i, the youngest calls there (gate.PodReporter).

import (
	"fmt"
	"net/url"
	"strings"

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

// PodLabel is the request label naming the pod (its base URL) the gate
// last placed the request on; it travels with a request taken back, so
// that the request resumes where its tokens are cached.
const PodLabel = "sluice_pod"

// podGauges are one pod's gauges of one reading.
type podGauges struct {
	running, waiting int
	kv               float64
}

// podState is what the gate keeps of one pod with dispatch "pods".
type podState struct {
	url   string // the pod's base URL: calls placed here go to url + the queue's path
	own   ledger
	peaks PeakHold
	rule  Rule
	// since counts the calls placed here since the pod's last reading.
	since int
	last  PodReading
}

// PodReading is what the last reading saw of one pod (dispatch "pods").
type PodReading struct {
	// URL is the pod's base URL.
	URL                         string
	Running, Waiting, Own       int
	Others, Held, Keep, Allowed int
	Burst                       bool
	KV                          float64

	// Peers are the other replicas' calls here (with an account), Pooled
	// the limit for every replica's calls here together (Allowed is this
	// replica's part of it).
	Peers, Pooled int
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
	r.Pods = make([]PodReading, len(g.pods))
	for i, p := range g.pods {
		pg := rd.pods[i]
		pr := PodReading{URL: p.url, Running: pg.running, Waiting: pg.waiting, KV: pg.kv, Own: p.own.at(r.At, c.ReleaseGrace),
			Peers: at(peers.InFlight, i)}
		pr.Others = g.share.confirmed(i, g.others(pg.running, pg.waiting, pr.Own+pr.Peers), peers)
		pr.Held = p.peaks.Held(r.At, c.Hold, pr.Others)
		kvCap := -1
		if c.KVLimit > 0 && pg.kv > c.KVLimit {
			kvCap = pr.Own + pr.Peers
			r.KVCap = max(0, r.KVCap) + kvCap
		}
		pr.Burst, pr.Keep, pr.Pooled = p.rule.Apply(r.At, pr.Others, pr.Held, pr.Own+pr.Peers, kvCap)
		pr.Allowed = share(pr.Pooled, pr.Own, peers, i)
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

// place picks the pod for req (see the file's notes) and labels req with
// it. When no pod takes it, place returns nil and why; stay says the
// request was taken back from a pod that has no room now and should wait
// for that pod, where its tokens are cached, rather than prefill again on
// another. g.mu is held.
func (g *Gate) place(req *wire.Request) (pod *podState, stay bool, why string) {
	now := g.now()
	var best *podState
	bestRoom := 0
	full, waiting, pending := 0, 0, 0
	prev, prevKnown := "", false
	if req != nil {
		prev = req.Label(PodLabel)
	}
	for _, p := range g.pods {
		prevKnown = prevKnown || p.url == prev
		room := p.last.Allowed - p.own.at(now, g.cfg.ReleaseGrace)
		switch {
		case room <= 0:
			full++
			continue
		case p.last.Waiting > 0:
			waiting++
			continue
		case p.since >= g.cfg.PendingPrefills:
			pending++
			continue
		}
		if p.url == prev { // where its tokens are cached
			best = p
			break
		}
		if room > bestRoom {
			best, bestRoom = p, room
		}
	}
	switch {
	case best == nil:
		return nil, false, fmt.Sprintf("no pod has room: %d full, %d with requests waiting, %d with a placement not read yet", full, waiting, pending)
	case prevKnown && best.url != prev:
		return nil, true, "waiting for the pod its tokens are cached on: " + prev
	}
	best.since++
	if req != nil {
		req.SetLabel(PodLabel, best.url)
	}
	return best, false, ""
}
