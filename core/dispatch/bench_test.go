package dispatch

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/dispatch/internal/loopback"
	"github.com/sluice-io/sluice/core/wire"
)

const benchResponse = `{"id":"cmpl-1","object":"text_completion","choices":[{"text":"4","index":0}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`

func benchRequest() *wire.Request {
	return &wire.Request{
		ID:       "batch_req_xyz",
		Deadline: time.Now().Add(time.Hour),
		Payload:  []byte(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":128}`),
		Metadata: map[string]string{"job_id": "batch_abc123", "request_index": "42", "userid": "tenant-7"},
		Headers:  map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
}

// BenchmarkDo calls a zero-latency httptest server. allocs/op includes the
// server's allocations (same process); see BenchmarkDoRawServer for the
// client's alone.
func BenchmarkDo(b *testing.B) {
	benchDo(b, newServer(b, benchHandler).URL)
}

// BenchmarkDoH2C is BenchmarkDo over HTTP/2 with prior knowledge.
func BenchmarkDoH2C(b *testing.B) {
	url, _ := loopback.H2C(b, 0, benchHandler)
	benchDoProto(b, url, ProtocolH2C)
}

// benchHandler reads the request and answers benchResponse.
func benchHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(benchResponse)))
	_, _ = io.WriteString(w, benchResponse)
}

// BenchmarkDoRawServer calls a minimal hand-written HTTP/1.1 server that
// allocates almost nothing, so allocs/op is the client's cost.
func BenchmarkDoRawServer(b *testing.B) {
	benchDo(b, rawServer(b))
}

func benchDo(b *testing.B, url string) { benchDoProto(b, url, ProtocolHTTP1) }

func benchDoProto(b *testing.B, url, protocol string) {
	c := newClient(b, Config{Protocol: protocol})
	target := Target{BaseURL: url, InferenceObjective: "batch"}
	req := benchRequest()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if out := c.Do(b.Context(), target, req); out.Class != Success {
				b.Fatalf("outcome: %+v", out)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if out := c.Do(b.Context(), target, req); out.Class != Success {
					b.Errorf("outcome: %+v", out)
					return
				}
			}
		})
	})
}

// rawServer serves every request with benchResponse and returns its URL.
func rawServer(tb testing.TB) string {
	tb.Helper()
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(benchResponse)) + "\r\n\r\n" + benchResponse)
	return "http://" + loopback.Serve(tb, func(conn net.Conn, _ int) { serveRaw(conn, resp) })
}

func serveRaw(conn net.Conn, resp []byte) {
	defer conn.Close()
	r := bufio.NewReaderSize(conn, 16<<10)
	clPrefix := []byte("content-length:")
	for {
		length := 0
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if len(line) > len(clPrefix) && bytes.EqualFold(line[:len(clPrefix)], clPrefix) {
				length, _ = strconv.Atoi(string(bytes.TrimSpace(line[len(clPrefix):])))
			}
		}
		if _, err := r.Discard(length); err != nil {
			return
		}
		if _, err := conn.Write(resp); err != nil {
			return
		}
	}
}
