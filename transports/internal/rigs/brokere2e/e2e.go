// Package brokere2e runs a sluice deployment over a watermill-transport broker for
// the brokers' end-to-end fault tests: the real pipeline (app), a gateway
// simulator, and a tally of the results read back. A test rig: only tests import it.
package brokere2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/transports/internal/rigs/dispatcher"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

// Gateway starts a gateway simulator answering after latency; it returns its base URL.
func Gateway(t testing.TB, latency time.Duration) string {
	t.Helper()
	s, err := simulator.New(simulator.Config{Latency: simulator.Fixed(latency)})
	if err != nil {
		t.Fatal(err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return base
}

// Run runs sluice with tp and the gates of ad (the test registers the
// constant gate: an adapter package imports no other) on queue → results
// (through gateway) until the returned stop is called (also at cleanup).
func Run(t testing.TB, tp *wmtransport.Transport, ad app.Adapters, queue, results, gateway string, concurrency int) (stop func()) {
	t.Helper()
	cfg := &config.Config{
		Transport:   wmtransport.Name,
		Concurrency: concurrency,
		TransportConfig: config.TransportConfig{
			ResultQueueName: results,
			Queues:          []config.Queue{{Queue: transport.Queue{Name: queue, MaxConcurrency: concurrency}, IGWBaseURL: gateway}},
		},
		MetricsPort:  -1,
		HealthPort:   -1,
		DrainTimeout: config.Duration(5 * time.Second),
		Retry:        config.Retry{Base: config.Duration(200 * time.Millisecond), Max: config.Duration(time.Second)},
	}
	_, stop = dispatcher.Run(t, cfg, app.Options{Adapters: ad, Transport: tp})
	return stop
}

// Request is the payload of request id (flat form), due in an hour.
func Request(id string) []byte {
	b, err := json.Marshal(map[string]any{"id": id, "created": time.Now().Unix(),
		"deadline": time.Now().Add(time.Hour).Unix(), "payload": map[string]any{"model": "m", "prompt": "hi " + id},
		"metadata": map[string]string{"job_id": "e2e"}})
	if err != nil {
		panic(err) // static shape
	}
	return b
}

// IDs returns n request ids prefix0..prefix(n-1).
func IDs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// Tally counts results per request id.
type Tally struct {
	// Results counts every result read, per id (more than 1: a duplicate).
	Results map[string]int
	// Failed lists ids with a result that is not a success.
	Failed []string
}

// NewTally returns an empty tally.
func NewTally() *Tally { return &Tally{Results: map[string]int{}} }

// Add records result payloads; it fails t on one that does not decode.
func (ta *Tally) Add(t testing.TB, payloads [][]byte) {
	t.Helper()
	for _, p := range payloads {
		r, err := wire.DecodeResult(p)
		if err != nil {
			t.Fatalf("result does not decode: %v: %s", err, p)
		}
		ta.Results[r.ID]++
		if !r.OK() {
			ta.Failed = append(ta.Failed, r.ID)
		}
	}
}

// Answered is how many distinct ids have a result.
func (ta *Tally) Answered() int { return len(ta.Results) }

// Check fails t unless every id has a successful result; it returns the
// number of duplicated results (logged, not a failure: delivery is at least
// once).
func (ta *Tally) Check(t testing.TB, ids []string) (duplicates int) {
	t.Helper()
	var lost []string
	for _, id := range ids {
		switch n := ta.Results[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			duplicates += n - 1
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d requests lost (no result), e.g. %v", len(lost), len(ids), lost[:min(len(lost), 10)])
	}
	if len(ta.Failed) > 0 {
		t.Errorf("%d results are not successes, e.g. %v", len(ta.Failed), ta.Failed[:min(len(ta.Failed), 10)])
	}
	return duplicates
}
