package app

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/sluice-io/sluice/core/transport"
)

// healthCheckTimeout bounds the transport's health check behind /readyz
// (upstream's checkerTimeout).
const healthCheckTimeout = 3 * time.Second

// healthBody is the JSON body of /healthz and /readyz, upstream's shape.
type healthBody struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// writeHealth answers with upstream's JSON body (encoding/json's Encoder: a
// trailing newline).
func writeHealth(w http.ResponseWriter, code int, b healthBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(b)
}

// handleHealthz answers liveness: 200 {"status":"ok"} for as long as the
// process serves, whatever the broker does.
func handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeHealth(w, http.StatusOK, healthBody{Status: "ok"})
}

// handleReadyz answers readiness: 503 {"status":"not ready"} while the
// pipeline is not claiming (before start, and from shutdown on, through the
// drain); otherwise the transport's health check, bounded by 3 s, decides
// between 200 {"status":"ready"} and 503 {"status":"not ready","error":...}.
// Every probe checks the broker afresh, as upstream does.
func (a *App) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if !a.pipe.Ready() {
		writeHealth(w, http.StatusServiceUnavailable, healthBody{Status: "not ready"})
		return
	}
	if hc, ok := a.transport.(transport.HealthChecker); ok {
		ctx, cancel := context.WithTimeout(r.Context(), healthCheckTimeout)
		defer cancel()
		if err := hc.CheckHealth(ctx, a.queues()); err != nil {
			writeHealth(w, http.StatusServiceUnavailable, healthBody{Status: "not ready", Error: err.Error()})
			return
		}
	}
	writeHealth(w, http.StatusOK, healthBody{Status: "ready"})
}

// queues returns the request queues the transport's health check covers.
func (a *App) queues() []transport.Queue {
	a.mu.Lock()
	live := a.live
	a.mu.Unlock()
	qs := make([]transport.Queue, len(live))
	for i, q := range live {
		qs[i] = q.Queue
	}
	return qs
}
