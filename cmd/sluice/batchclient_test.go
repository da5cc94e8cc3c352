package main

import (
	"context"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestBatchClientWire checks what the client sends (the multipart upload,
// the key) and that it makes a call once more after a 503, not after a 400.
func TestBatchClientWire(t *testing.T) {
	var uploads, gets atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Authorization"); got != "Bearer sk-test" {
			t.Errorf("%s %s: Authorization %q", r.Method, r.URL.Path, got)
		}
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/files":
			if uploads.Add(1) == 1 {
				http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
				return
			}
			_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil {
				t.Fatal(err)
			}
			form, err := multipart.NewReader(r.Body, params["boundary"]).ReadForm(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			fh := form.File["file"]
			if form.Value["purpose"][0] != "batch" || len(fh) != 1 || fh[0].Filename != "in.jsonl" {
				t.Errorf("upload form: %v %v", form.Value, fh)
			}
			f, _ := fh[0].Open()
			b, _ := io.ReadAll(f)
			if string(b) != "{}\n" {
				t.Errorf("uploaded %q", b)
			}
			io.WriteString(w, `{"id":"file-1"}`)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/batches":
			b, _ := io.ReadAll(r.Body)
			if !strings.Contains(string(b), `"input_file_id":"file-1"`) || !strings.Contains(string(b), `"metadata":{"k":"v"}`) {
				t.Errorf("create body %s", b)
			}
			io.WriteString(w, `{"id":"batch_1","status":"validating","request_counts":{"total":1}}`)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/batches/batch_1":
			gets.Add(1)
			http.Error(w, `{"error":{"message":"nope"}}`, http.StatusBadRequest)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	t.Setenv("OPENAI_API_KEY", "sk-test")
	c, err := newBatchClient(srv.URL + "/v1/")
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(in, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := c.submit(context.Background(), in, "/v1/chat/completions", "24h", map[string]string{"k": "v"})
	if err != nil || b.ID != "batch_1" || b.Status != batchValidating || b.RequestCounts.Total != 1 || !strings.Contains(string(b.raw), `"batch_1"`) {
		t.Fatalf("submit: %+v, %v", b, err)
	}
	if uploads.Load() != 2 {
		t.Errorf("%d uploads, want 2 (one 503, one retry)", uploads.Load())
	}
	_, err = c.getBatch(context.Background(), "batch_1")
	if err = c.explain("get batch batch_1", err); err == nil || err.Error() != "get batch batch_1: 400 nope" || gets.Load() != 1 {
		t.Errorf("get after a 400: %v after %d calls, want the message after 1", err, gets.Load())
	}
}
