package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/pipeline"
)

// Hot reload of the queue configuration (upstream's
// --transport-config-watch-interval).
//
// While Run runs, the watcher reads the files of Reload.Files every
// Reload.Interval. When their content (a SHA-256 of every file, or of the
// error reading it) differs from what it last saw, it loads the whole
// configuration again with Reload.Load, exactly as at start, and hands it
// to Reconfigure. Each change of content is one reload attempt, counted
// once in async_queue_config_reloads_total{result="success"|"error"}
// (upstream's label values); a success also sets
// async_queue_config_last_success_timestamp_seconds. A file that stays
// broken is not retried until it changes again, and an error is logged
// once for as long as it stays the same error.
//
// Only the queues may change, as upstream reloads only the "queues" field:
// added queues start claiming, removed ones stop claiming and drain, changed
// ones are replaced (pipeline.Reconfigure says exactly how), unchanged ones
// are not touched. Every queue setting counts as a change: names, result
// destination and result_ttl_seconds, max_concurrency, the gateway, gate
// type and parameters, worker pool, labels. A change anywhere else (the
// transport, its options such as the Redis URL or poll interval, worker
// pools, the merge policy, timeouts) cannot be applied without a restart:
// the reload is refused, naming the fields, and counted as an error. Any
// error keeps the running configuration.
//
// An unchanged queue keeps its gate loop; the queues a reload adds or
// changes get new gate loops (shared among them by definition, as at
// start), and a gate loop no queue uses any more is closed once the queues
// that used it drained.

// Reload configures the queue configuration's hot reload.
type Reload struct {
	// Interval is how often Files are read (must be above 0).
	Interval time.Duration
	// Files are the files whose content is watched (at least one): a
	// change in any of them makes the watcher call Load.
	Files []string
	// Load reads the whole configuration again, defaulted, as it was read
	// at start (required).
	Load func() (*config.Config, error)
}

// validate reports a Reload that cannot work (nil r: no reload, valid).
func (r *Reload) validate() error {
	switch {
	case r == nil:
		return nil
	case r.Interval <= 0:
		return fmt.Errorf("reload: interval %s must be above 0", r.Interval)
	case len(r.Files) == 0:
		return errors.New("reload: no file to watch")
	case r.Load == nil:
		return errors.New("reload: no Load function")
	}
	return nil
}

// watch runs the reload loop until ctx ends.
func (a *App) watch(ctx context.Context, r Reload) {
	seen := contentHash(r.Files)
	lastErr := ""
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	a.log.Info("watching the queue configuration", "files", r.Files, "interval", r.Interval.String())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h := contentHash(r.Files)
		if h == seen || !a.pipe.Ready() {
			continue // unchanged, or not claiming yet (or any more): look again next time
		}
		ch, err := a.reloadOnce(ctx, r.Load)
		if errors.Is(err, pipeline.ErrNotRunning) {
			continue
		}
		seen = h
		// The log line comes first: who sees the count sees the line.
		if err != nil {
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				a.log.Error("queue config reload failed; the running queues are kept", "err", err)
			}
			a.metrics.QueueConfigReloads.WithLabelValues(metrics.ReloadError).Inc()
			continue
		}
		lastErr = ""
		a.log.Info("queue config reloaded", "added", ch.Added, "removed", ch.Removed, "changed", ch.Changed)
		a.metrics.QueueConfigLastSuccess.Set(float64(time.Now().UnixNano()) / 1e9)
		a.metrics.QueueConfigReloads.WithLabelValues(metrics.ReloadSuccess).Inc()
	}
}

// reloadOnce loads the configuration and applies it.
func (a *App) reloadOnce(ctx context.Context, load func() (*config.Config, error)) (pipeline.Changes, error) {
	cfg, err := load()
	if err != nil {
		return pipeline.Changes{}, err
	}
	return a.Reconfigure(ctx, cfg)
}

// contentHash digests the files' contents (or the errors reading them).
func contentHash(files []string) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			data = []byte("error: " + err.Error())
		}
		fmt.Fprintf(h, "%d:%s\x00%d:", len(f), f, len(data))
		h.Write(data)
	}
	var out [sha256.Size]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Reconfigure applies cfg, a defaulted configuration read again, to the
// running deployment: its queues replace the running ones (see the comment
// at the top of reload.go). cfg must differ from the running configuration
// in its queues only; the queues are validated as at start, except that
// the list may be empty. On an error nothing changed. It fails with
// pipeline.ErrNotRunning when Run is not claiming.
func (a *App) Reconfigure(ctx context.Context, cfg *config.Config) (pipeline.Changes, error) {
	a.reconfMu.Lock()
	defer a.reconfMu.Unlock()
	cfg.SetDefaults()
	if fields := fixedChanges(a.cfg, cfg); len(fields) > 0 {
		return pipeline.Changes{}, fmt.Errorf("only the queues can change without a restart, and %s changed: restart sluice to apply it", strings.Join(fields, ", "))
	}
	candidate := *a.cfg
	candidate.TransportConfig.Queues = cfg.TransportConfig.Queues
	if err := candidate.Validate(a.known); err != nil {
		var ps config.Problems
		if !errors.As(err, &ps) {
			return pipeline.Changes{}, err
		}
		// Upstream allows an empty queue list on reload.
		ps = slices.DeleteFunc(ps, func(p config.Problem) bool { return p.Where == "transport_config.queues" })
		if len(ps) > 0 {
			return pipeline.Changes{}, ps
		}
	}
	qs := cfg.TransportConfig.Queues
	queues, built, err := a.buildQueues(qs, func(q config.Queue) (pipeline.Queue, bool) {
		s, ok := a.specs[q.ID]
		if !ok || !reflect.DeepEqual(s.cfg, q) {
			return pipeline.Queue{}, false
		}
		return s.queue, true
	})
	if err != nil {
		return pipeline.Changes{}, err
	}
	ch, err := a.pipe.Reconfigure(ctx, queues)
	if err != nil {
		if !errors.Is(err, pipeline.ErrStartClaims) {
			a.dropGates(built)
		}
		return ch, err
	}
	specs := make(map[string]queueSpec, len(qs))
	for i, q := range qs {
		specs[q.ID] = queueSpec{cfg: q, queue: queues[i]}
	}
	a.specs = specs
	a.mu.Lock()
	a.live = slices.Clone(qs)
	a.mu.Unlock()
	return ch, nil
}

// dropGates closes gate loops built for queues that never ran and forgets
// them.
func (a *App) dropGates(built []*gate.Refresher) {
	for _, r := range built {
		_ = r.Close()
	}
	a.mu.Lock()
	a.gates = slices.DeleteFunc(a.gates, func(r *gate.Refresher) bool { return slices.Contains(built, r) })
	a.mu.Unlock()
}

// gateList returns every gate loop built.
func (a *App) gateList() []*gate.Refresher {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.gates)
}

// fixedChanges names the settings outside the queues in which next differs
// from cur: the top-level keys of the config, and the transport config's
// own keys as transport_config.<key> (values are not named: they may hold
// secrets).
func fixedChanges(cur, next *config.Config) []string {
	flat := func(c *config.Config) map[string]json.RawMessage {
		cp := *c
		cp.TransportConfig.Queues = nil
		data, err := json.Marshal(&cp)
		out := map[string]json.RawMessage{}
		if err != nil {
			out["(config)"] = json.RawMessage(fmt.Sprintf("%q", err.Error()))
			return out
		}
		_ = json.Unmarshal(data, &out)
		var tc map[string]json.RawMessage
		_ = json.Unmarshal(out["transport_config"], &tc)
		delete(out, "transport_config")
		delete(tc, "queues")
		for k, v := range tc {
			out["transport_config."+k] = v
		}
		return out
	}
	a, b := flat(cur), flat(next)
	var diff []string
	for k, v := range a {
		if w, ok := b[k]; !ok || !jsonEqual(v, w) {
			diff = append(diff, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diff = append(diff, k)
		}
	}
	sort.Strings(diff)
	return diff
}

// jsonEqual compares two JSON values (object keys in any order).
func jsonEqual(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
