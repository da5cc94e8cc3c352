package simulator

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

var benchBody = []byte(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":128}`)

// BenchmarkServer pushes chat completions with no latency through a real
// loopback connection from parallel keep-alive clients. Client and server run
// in this process, so ns/op and allocs/op count both sides.
func BenchmarkServer(b *testing.B) {
	s, base, _ := startSim(b, Config{})
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	url := base + PathChatCompletions
	b.SetParallelism(4) // 4×GOMAXPROCS clients keep the server busy during round trips
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(benchBody))
			if err != nil {
				b.Error(err)
				return
			}
			req.Header["Content-Type"] = []string{"application/json"}
			resp, err := c.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if st := s.Stats(); st.OK < uint64(b.N) {
		b.Fatalf("server answered %d of %d", st.OK, b.N)
	}
}

// BenchmarkHandler measures the handler alone, without net/http's connection
// handling: its ns/op and allocs/op are the simulator's own cost per request.
func BenchmarkHandler(b *testing.B) {
	s, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	rd := bytes.NewReader(benchBody)
	req, _ := http.NewRequest(http.MethodPost, "http://sim"+PathChatCompletions, nil)
	req.Body = io.NopCloser(rd)
	w := newRecorder()
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(benchBody)
		w.reset()
		h.ServeHTTP(w, req)
	}
	if w.status != http.StatusOK {
		b.Fatalf("status %d", w.status)
	}
}
