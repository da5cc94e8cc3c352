package redissortedset_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The client suite of the batch-gateway after July 2026 (CLIENTS.md §2):
// queue and result names are the operator's (async_dispatch.models.<model>
// request_queue_name / result_queue_name, #629), with no llm-d-async:
// prefix anywhere; each processor replica reads its own result list
// <result_queue_base>:<processor_id> (#662) with upstream's durable result
// delivery; lines may name any endpoint (/v1/classify, /v1/pooling, #656),
// which the dispatcher forwards as data.endpoint says. The names must hold
// everywhere sluice shows a queue: the transport's keys, the metrics'
// labels, the status page, the registry `sluice queues` lists, and the
// migration commands.

// httpGet fetches url, retrying while the server is not up yet.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			err = fmt.Errorf("status %d, %v", resp.StatusCode, rerr)
		}
		if time.Now().After(end) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClientBatchGatewayAfterJuly(t *testing.T) {
	f, gw := cutoverFixture(t, 5*time.Millisecond)
	c := f.prod.Client()
	ctx := context.Background()
	const q, base, perReplica = "acme/batch-q", "acme/results", 30
	endpoints := []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/classify", "/v1/pooling", "/v1/score"}
	procs := make([]*bgProcessor, 2)
	for i := range procs {
		list := fmt.Sprintf("%s:replica-%d", base, i+1)
		procs[i] = &bgProcessor{c: c, list: list, owner: randHex(t, 16), lease: 30 * time.Second,
			up: upProducer{c: c, queue: q, results: list}}
	}
	dl := time.Now().Add(time.Hour).Unix()
	tokens, listOf, endpointOf := map[string]string{}, map[string]int{}, map[string]string{}
	for i := range perReplica {
		for r, p := range procs {
			id := fmt.Sprintf("batch_%d-line-%02d", r+1, i)
			up := p.up
			up.endpoint = endpoints[(i+r)%len(endpoints)]
			tokens[id] = up.submit(t, id, dl, payloadFor(id))
			listOf[id], endpointOf[id] = r, up.endpoint
		}
	}
	port := testenv.FreePort(t)
	f.tune = func(cfg *config.Config) { cfg.MetricsPort, cfg.ListenHost = port, "127.0.0.1" }
	tp := f.transport(rss.Options{PollIntervalMS: 20})
	// The deployment's default result list is the operator's base; the
	// queue names no result list, so each envelope's own wins.
	f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: q, ResultTTLSeconds: 600}, IGWBaseURL: f.sim}}, base, 8)

	seen := readResults(t, procs, listOf, len(tokens), 20*time.Second, func(_ int, id string, m map[string]any) bool {
		checkBGResult(t, m, tokens[id], false)
		return true
	})
	if len(seen) != len(tokens) {
		t.Fatalf("the processors read %d of %d results", len(seen), len(tokens))
	}
	calls, _ := gw.counts()
	gw.mu.Lock()
	paths := maps.Clone(gw.paths)
	gw.mu.Unlock()
	for id := range tokens {
		if seen[id] != 1 || calls[id] != 1 {
			t.Errorf("%s: read %d times, dispatched %d times", id, seen[id], calls[id])
		}
		if paths[id] != endpointOf[id] {
			t.Errorf("%s: forwarded to %s, want its data.endpoint %s", id, paths[id], endpointOf[id])
		}
	}
	if n := c.Exists(ctx, base, "llm-d-async:results:acme", "result-list").Val(); n != 0 {
		t.Errorf("%d results outside the replicas' lists", n)
	}

	// Where sluice shows the queue: its registry (`sluice queues`), its
	// depth, the metrics and the status page name it as the operator did.
	reg := c.SMembers(ctx, f.prod.Names().Registry()).Val()
	if !slices.Contains(reg, q) {
		t.Errorf("registry %v: no %s", reg, q)
	}
	if d, err := rss.QueueDepth(ctx, c, f.prod.Names(), q); err != nil || d.Waiting != 0 || d.InFlight != 0 {
		t.Errorf("depth of %s: %+v %v", q, d, err)
	}
	metrics := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if !strings.Contains(metrics, `queue_name="`+q+`"`) {
		t.Errorf("no metric labelled queue_name=%q", q)
	}
	status := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/status.json", port))
	if !strings.Contains(status, `"`+q+`"`) {
		t.Errorf("the status page does not name %s: %.400s", q, status)
	}
	for what, text := range map[string]string{"metrics": metrics, "status page": status} {
		if strings.Contains(text, "llm-d-async:") {
			i := strings.Index(text, "llm-d-async:")
			t.Errorf("%s derive a llm-d-async: name: %q", what, text[max(i-80, 0):min(i+80, len(text))])
		}
	}
	// sluice's own keys live under its prefix (llm-d-async:queues, ...);
	// no queue or result list may be derived there.
	for _, pat := range []string{"llm-d-async:requests:*", "llm-d-async:results:*"} {
		for _, k := range c.Keys(ctx, pat).Val() {
			t.Errorf("key %s: a queue name derived from llm-d-async:", k)
		}
	}
	// The migration commands take the operator's name.
	m, err := rss.NewMigrator(c, rss.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckLeases(ctx, q); err != nil {
		t.Errorf("check leases of %s: %v", q, err)
	}
}
