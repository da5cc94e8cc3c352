// Package metricsauthtest is a fake Kubernetes API server for tests of
// metricsauth and of what embeds it: it answers TokenReviews and
// SubjectAccessReviews over TLS, per token, and counts the calls.
package metricsauthtest

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The tokens the fake knows. Any other token is not authenticated.
const (
	// TokenAllowed is user "alice" (uid "u1", group "monitoring"), allowed.
	TokenAllowed = "good"
	// TokenDenied is user "bob", authenticated and not allowed.
	TokenDenied = "denied"
	// ServiceAccountToken is the token the fake expects the reviews to be
	// sent with (the content of TokenFile).
	ServiceAccountToken = "sa-token"
)

// User is the user of a TokenReview answer.
type User struct {
	Username string              `json:"username,omitempty"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// TokenReview is a TokenReview as the fake received and answered it.
type TokenReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Token string `json:"token"`
	} `json:"spec"`
	Status struct {
		Authenticated bool   `json:"authenticated"`
		User          User   `json:"user"`
		Error         string `json:"error,omitempty"`
	} `json:"status"`
}

// AccessReview is a SubjectAccessReview as the fake received and answered it.
type AccessReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		NonResourceAttributes *struct {
			Path string `json:"path"`
			Verb string `json:"verb"`
		} `json:"nonResourceAttributes,omitempty"`
		ResourceAttributes json.RawMessage     `json:"resourceAttributes,omitempty"`
		User               string              `json:"user,omitempty"`
		UID                string              `json:"uid,omitempty"`
		Groups             []string            `json:"groups,omitempty"`
		Extra              map[string][]string `json:"extra,omitempty"`
	} `json:"spec"`
	Status struct {
		Allowed bool   `json:"allowed"`
		Reason  string `json:"reason,omitempty"`
	} `json:"status"`
}

// API is the fake API server. Its fields are set by New and read-only.
type API struct {
	// URL is the server's https base URL.
	URL string
	// CAFile is a PEM file with the server's certificate.
	CAFile string
	// TokenFile holds ServiceAccountToken.
	TokenFile string

	srv      *httptest.Server
	mu       sync.Mutex
	down     bool
	failNext []int
	requests int
	reviews  []TokenReview
	accesses []AccessReview
}

// New starts a fake API server, closed when the test ends.
func New(t testing.TB) *API {
	t.Helper()
	a := &API{}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	a.URL = a.srv.URL
	dir := t.TempDir()
	a.CAFile, a.TokenFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})
	if err := os.WriteFile(a.CAFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.TokenFile, []byte(ServiceAccountToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

// HostPort returns the server's host and port, for KUBERNETES_SERVICE_HOST
// and KUBERNETES_SERVICE_PORT.
func (a *API) HostPort() (host, port string) {
	host, port, _ = net.SplitHostPort(a.srv.Listener.Addr().String())
	return host, port
}

// SetDown makes every call fail with 503 (down) or answer again.
func (a *API) SetDown(down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
}

// FailNext makes the next calls answer the given statuses, one each, before
// answering again.
func (a *API) FailNext(statuses ...int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failNext = append(a.failNext, statuses...)
}

// Requests returns the number of requests received, failed ones included.
func (a *API) Requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests
}

// Close stops the server: the API is unreachable.
func (a *API) Close() { a.srv.Close() }

// Calls returns the number of TokenReviews and SubjectAccessReviews answered.
func (a *API) Calls() (authn, authz int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.reviews), len(a.accesses)
}

// TokenReviews returns the TokenReviews answered, in order.
func (a *API) TokenReviews() []TokenReview {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]TokenReview(nil), a.reviews...)
}

// AccessReviews returns the SubjectAccessReviews answered, in order.
func (a *API) AccessReviews() []AccessReview {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AccessReview(nil), a.accesses...)
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	if len(a.failNext) > 0 {
		code := a.failNext[0]
		a.failNext = a.failNext[1:]
		http.Error(w, `{"kind":"Status"}`, code)
		return
	}
	if a.down {
		http.Error(w, `{"kind":"Status","code":503}`, http.StatusServiceUnavailable)
		return
	}
	tok, _ := os.ReadFile(a.TokenFile)
	if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer "+string(trim(tok)) || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
		return
	}
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		var tr TokenReview
		if err := json.Unmarshal(body, &tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch tr.Spec.Token {
		case TokenAllowed:
			tr.Status.Authenticated, tr.Status.User = true, User{Username: "alice", UID: "u1", Groups: []string{"monitoring"}}
		case TokenDenied:
			tr.Status.Authenticated, tr.Status.User = true, User{Username: "bob"}
		default:
			tr.Status.Error = "token not valid"
		}
		a.reviews = append(a.reviews, tr)
		created(w, tr)
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		var ar AccessReview
		if err := json.Unmarshal(body, &ar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ar.Status.Allowed = ar.Spec.User == "alice"
		a.accesses = append(a.accesses, ar)
		created(w, ar)
	default:
		http.NotFound(w, r)
	}
}

func created(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(v)
}

func trim(b []byte) []byte { return bytes.TrimSpace(b) }
