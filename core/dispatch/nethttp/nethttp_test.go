package nethttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// Post sends the body and headers as given, with a content length, and the
// response comes back unread.
func TestPost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.ContentLength != int64(len(b)) || r.Header.Get("X-Test") != "1" {
			http.Error(w, "bad request shape", http.StatusBadRequest)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	tr := New(Config{})
	t.Cleanup(tr.CloseIdleConnections)
	u, err := url.Parse(srv.URL + "/v1/x?y=1")
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"", `{"a":1}`} {
		resp, err := tr.Post(context.Background(), u, http.Header{"X-Test": {"1"}}, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(got) != body {
			t.Fatalf("body %q: status %d, %q, %v", body, resp.StatusCode, got, err)
		}
	}
}
