package dispatch

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestJoinURL(t *testing.T) {
	tests := []struct {
		base, path, want string
	}{
		{"http://gw", "/v1/completions", "http://gw/v1/completions"},
		{"http://gw/", "/v1/completions", "http://gw/v1/completions"},
		{"http://gw", "v1/completions", "http://gw/v1/completions"},
		{"http://gw/", "v1/completions", "http://gw/v1/completions"},
		{"http://gw:8080/prefix", "/v1/completions", "http://gw:8080/prefix/v1/completions"},
		{"http://gw:8080/prefix/", "/v1/completions", "http://gw:8080/prefix/v1/completions"},
		{"http://gw/prefix//", "/v1/chat", "http://gw/prefix/v1/chat"},
		{"https://gw/a/b", "/c/", "https://gw/a/b/c/"},
		{"http://gw/prefix", "/v1/x?api-version=2", "http://gw/prefix/v1/x?api-version=2"},
		{"http://gw/pre%2Ffix", "/v1/a%20b", "http://gw/pre%2Ffix/v1/a%20b"},
		{"http://user:pw@gw", "/v1", "http://user:pw@gw/v1"},
		{"http://[::1]:80", "/v1", "http://[::1]:80/v1"},
	}
	for _, tt := range tests {
		pt, err := prepareTarget(Target{BaseURL: tt.base})
		if err != nil {
			t.Fatalf("prepareTarget(%q): %v", tt.base, err)
		}
		ep, err := joinURL(pt.base, tt.path)
		if err != nil {
			t.Errorf("join(%q, %q): %v", tt.base, tt.path, err)
			continue
		}
		if got := ep.u.String(); got != tt.want {
			t.Errorf("join(%q, %q) = %q, want %q", tt.base, tt.path, got, tt.want)
		}
	}
}

func TestPrepareTargetDefaultPath(t *testing.T) {
	pt, err := prepareTarget(Target{BaseURL: "http://gw/prefix/"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pt.def.u.String(); got != "http://gw/prefix/v1/completions" {
		t.Fatalf("default url = %q", got)
	}
	if pt.def.s != "http://gw/prefix/v1/completions" {
		t.Fatalf("default url string = %q", pt.def.s)
	}
	pt, err = prepareTarget(Target{BaseURL: "http://u:secret@gw"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(pt.def.s, "secret") {
		t.Fatalf("url in errors shows the password: %q", pt.def.s)
	}
}

func TestPrepareTargetErrors(t *testing.T) {
	tests := []Target{
		{BaseURL: ""},
		{BaseURL: "gw:8080"},
		{BaseURL: "ftp://gw"},
		{BaseURL: "http://"},
		{BaseURL: "http://gw/?a=b"},
		{BaseURL: "http://gw/#frag"},
		{BaseURL: "http://gw", Path: "http://other/v1"},
		{BaseURL: "http://gw", Path: "//other/v1"},
		{BaseURL: "http://gw", Path: "/v1#frag"},
		{BaseURL: "http://gw", Path: "/v1/%zz"},
	}
	c := newClient(t, Config{})
	for _, tt := range tests {
		err := c.Prepare(tt)
		if !errors.Is(err, ErrInvalidTarget) {
			t.Errorf("Prepare(%+v) = %v, want ErrInvalidTarget", tt, err)
		}
		out := c.Do(t.Context(), tt, newRequest(time.Minute))
		if out.Class != Fatal || !errors.Is(out.Err, ErrInvalidTarget) {
			t.Errorf("Do(%+v) = %+v, want Fatal ErrInvalidTarget", tt, out)
		}
	}
}

func TestEndpoint(t *testing.T) {
	paths := make(chan string, 10)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.RequestURI()
	})
	c := newClient(t, Config{})
	target := Target{BaseURL: srv.URL + "/prefix/", Path: "v1/completions"}

	for _, tt := range []struct{ endpoint, want string }{
		{"", "/prefix/v1/completions"},
		{"/v1/chat/completions", "/prefix/v1/chat/completions"},
		{"v1/chat/completions", "/prefix/v1/chat/completions"},
		{"/v1/embeddings?x=1", "/prefix/v1/embeddings?x=1"},
	} {
		req := newRequest(time.Minute)
		req.Endpoint = tt.endpoint
		if out := c.Do(t.Context(), target, req); out.Class != Success {
			t.Fatalf("endpoint %q: %+v", tt.endpoint, out)
		}
		if got := <-paths; got != tt.want {
			t.Errorf("endpoint %q: server saw %q, want %q", tt.endpoint, got, tt.want)
		}
	}

	for _, bad := range []string{"http://evil/v1", "//evil/v1", "/v1#x", "/%zz"} {
		req := newRequest(time.Minute)
		req.Endpoint = bad
		out := c.Do(t.Context(), target, req)
		if out.Class != Fatal || !errors.Is(out.Err, ErrInvalidEndpoint) {
			t.Errorf("endpoint %q: %+v, want Fatal ErrInvalidEndpoint", bad, out)
		}
	}
	select {
	case p := <-paths:
		t.Fatalf("an invalid endpoint reached the server: %q", p)
	default:
	}
}

func TestTargetCacheBounded(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	c := newClient(t, Config{})
	for i := range maxCachedTargets + 10 {
		tgt := Target{BaseURL: srv.URL, InferenceObjective: strings.Repeat("x", i)}
		if err := c.Prepare(tgt); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.targets.Len(); n != maxCachedTargets {
		t.Fatalf("cached %d targets, want %d", n, maxCachedTargets)
	}
	// Past the bound, targets still work.
	tgt := Target{BaseURL: srv.URL, InferenceObjective: "late"}
	if out := c.Do(t.Context(), tgt, newRequest(time.Minute)); out.StatusCode != http.StatusNotFound {
		t.Fatalf("uncached target: %+v", out)
	}
}
