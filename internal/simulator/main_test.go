package simulator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startSim starts a simulator on loopback and returns it, its base URL and a
// keep-alive client; both are closed when the test ends.
func startSim(t testing.TB, cfg Config) (*Server, string, *http.Client) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections) // runs before the server's Close
	return s, base, &http.Client{Transport: tr}
}

// post sends body to url with the given headers (name, value pairs).
func post(ctx context.Context, c *http.Client, url, body string, headers ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func mustPost(t testing.TB, c *http.Client, url, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := post(context.Background(), c, url, body, headers...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp, b
}

// openAIError is the error body of every non-200 answer.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t testing.TB, body []byte) openAIError {
	t.Helper()
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("error body %q lacks message or type", body)
	}
	return e
}

// eventually polls cond until it holds or a few seconds pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
