package redisstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// TestUpstreamCancelAtDispatch: requests carrying a request token wait in
// the stream while the calls before them run; upstream's cancel markers
// (request-cancel:<id> = the token) written meanwhile stop every one of
// them: no gateway call starts after the markers, and each is answered
// CANCELLED (issue 44, item 2, on this transport).
func TestUpstreamCancelAtDispatch(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	var mu sync.Mutex
	started := map[string]time.Time{}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			return
		}
		var p struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(req.Body).Decode(&p)
		mu.Lock()
		started[p.Prompt] = time.Now()
		mu.Unlock()
		select {
		case <-time.After(400 * time.Millisecond):
		case <-req.Context().Done():
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer gw.Close()
	const stream, results, n = "acme/stream-q", "acme/stream-results", 12
	dl := time.Now().Add(time.Hour).Unix()
	for i := range n {
		id := fmt.Sprintf("s-%02d", i)
		if err := rc.Set(ctx, "request-active:"+id, "tok-"+id, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		xadd(t, rc, stream, fmt.Appendf(nil, `{"request_kind":"plain","internal":{"request_token":"tok-%s"},"data":{"id":%q,"deadline":%d,"payload":{"model":"m","prompt":%q}}}`, id, id, dl, id))
	}
	tp := newTransport(t, redisstream.Options{Server: redisstream.Server{URL: r.URL}, BlockMS: 20, ResultMode: redisstream.ResultList})
	cfg := &config.Config{Transport: redisstream.Name, Concurrency: 2, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: stream}, IGWBaseURL: gw.URL, GateType: constant.Type}}}}
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: tp})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app: %v", err)
		}
	}()
	// Two calls run (concurrency 2); then the markers of every other.
	end := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		k := len(started)
		mu.Unlock()
		if k >= 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no call started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	called := map[string]bool{}
	for id := range started {
		called[id] = true
	}
	mu.Unlock()
	at := time.Now()
	if _, err := rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range n {
			if id := fmt.Sprintf("s-%02d", i); !called[id] {
				p.Set(ctx, "request-cancel:"+id, "tok-"+id, time.Hour)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]any{}
	end = time.Now().Add(10 * time.Second)
	for len(got) < n {
		v, err := rc.BRPop(ctx, time.Second, results).Result()
		if err != nil && time.Now().After(end) {
			t.Fatalf("%d of %d results: %v", len(got), n, err)
		}
		if err != nil {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(v[1]), &m); err != nil {
			t.Fatal(err)
		}
		id, _ := m["id"].(string)
		if got[id] != nil {
			t.Errorf("%s answered twice", id)
		}
		got[id] = m
	}
	mu.Lock()
	defer mu.Unlock()
	for id, s := range started {
		if s.After(at) {
			t.Errorf("%s: its call started after its cancel marker", id)
		}
	}
	for id, m := range got {
		want := "CANCELLED"
		if called[id] {
			want = ""
		}
		if code, _ := m["error_code"].(string); code != want {
			t.Errorf("%s: %v, want error_code %q", id, m, want)
		}
	}
}
