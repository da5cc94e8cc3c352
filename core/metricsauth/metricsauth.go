// Package metricsauth protects an HTTP endpoint (sluice's /metrics) the way
// upstream's --metrics-endpoint-auth does (controller-runtime's metrics
// filter): the bearer token of each request is authenticated by a
// Kubernetes TokenReview and the user is authorized by a SubjectAccessReview
// for the request's non-resource path with the request method in lower case
// as the verb, both against the in-cluster API server with the pod's
// service-account token and CA. Answers are cached as upstream caches them:
// token reviews 1 minute, allowed 5 minutes, denied 30 seconds.
//
// It talks to the API server with net/http and encoding/json (two POSTs),
// not client-go.
package metricsauth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// The service-account files every pod has mounted, and the API paths.
const (
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

	tokenReviewPath  = "/apis/authentication.k8s.io/v1/tokenreviews"
	accessReviewPath = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
)

// ErrNotInCluster is returned by New (wrapped) when the process does not
// run in a Kubernetes pod: no KUBERNETES_SERVICE_HOST/PORT, or no
// service-account token file.
var ErrNotInCluster = errors.New("not running in a Kubernetes cluster")

// Config says where the API server and the credentials are. The zero value
// is the in-cluster setup.
type Config struct {
	// Host is the API server's base URL (default
	// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
	Host string
	// TokenFile holds the bearer token the reviews are sent with (default
	// DefaultTokenFile). It is read again for every review, so a rotated
	// token is picked up.
	TokenFile string
	// CAFile holds the PEM CA bundle the API server is verified with
	// (default DefaultCAFile).
	CAFile string
	// Getenv reads the service environment (default os.Getenv).
	Getenv func(string) string
	// AuthnTTL caches token reviews, authenticated or not (default 1m).
	AuthnTTL time.Duration
	// AllowTTL caches allowed access reviews (default 5m).
	AllowTTL time.Duration
	// DenyTTL caches denied access reviews (default 30s).
	DenyTTL time.Duration
	// Timeout bounds one review, retries included (default 10s, upstream's
	// token review timeout).
	Timeout time.Duration
	// Retries and RetryBackoff are upstream's back-off for a review that
	// failed transiently (connection reset, 429, 500, 504, or an answer with
	// Retry-After): up to Retries attempts in all (default 5), waiting
	// RetryBackoff (default 500ms), then 1.5 times longer each time, ±20%.
	Retries      int
	RetryBackoff time.Duration
	// Now is the clock of the caches (default time.Now).
	Now func() time.Time
	// Logger receives review failures (default: discarded).
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.Host == "" {
		if h, p := c.Getenv("KUBERNETES_SERVICE_HOST"), c.Getenv("KUBERNETES_SERVICE_PORT"); h != "" && p != "" {
			c.Host = "https://" + net.JoinHostPort(h, p)
		}
	}
	if c.TokenFile == "" {
		c.TokenFile = DefaultTokenFile
	}
	if c.CAFile == "" {
		c.CAFile = DefaultCAFile
	}
	if c.AuthnTTL == 0 {
		c.AuthnTTL = time.Minute
	}
	if c.AllowTTL == 0 {
		c.AllowTTL = 5 * time.Minute
	}
	if c.DenyTTL == 0 {
		c.DenyTTL = 30 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Retries == 0 {
		c.Retries = 5
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = 500 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate checks a defaulted config: an API server to ask and a readable,
// non-empty token file (ErrNotInCluster otherwise), positive durations.
func (c *Config) Validate() error {
	if c.Host == "" {
		return fmt.Errorf("%w: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set", ErrNotInCluster)
	}
	if !strings.HasPrefix(c.Host, "https://") {
		return fmt.Errorf("API server %q: want an https:// URL", c.Host)
	}
	tok, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return fmt.Errorf("%w: service-account token: %w", ErrNotInCluster, err)
	}
	if strings.TrimSpace(string(tok)) == "" {
		return fmt.Errorf("%w: service-account token %s is empty", ErrNotInCluster, c.TokenFile)
	}
	for name, d := range map[string]time.Duration{"AuthnTTL": c.AuthnTTL, "AllowTTL": c.AllowTTL, "DenyTTL": c.DenyTTL, "Timeout": c.Timeout, "RetryBackoff": c.RetryBackoff} {
		if d < 0 {
			return fmt.Errorf("%s: %v is negative", name, d)
		}
	}
	if c.Retries < 0 {
		return fmt.Errorf("retries: %d is negative", c.Retries)
	}
	return nil
}

// Guard checks the requests to a handler. It is safe for concurrent use.
type Guard struct {
	cfg    Config
	client *http.Client
	authn  cache[user]
	authz  cache[bool]
}

// New defaults and validates cfg, and loads the CA.
func New(cfg Config) (*Guard, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("service-account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("service-account CA %s: no PEM certificate", cfg.CAFile)
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Guard{
		cfg:    cfg,
		client: &http.Client{Transport: tr},
		authn:  cache[user]{now: cfg.Now, m: map[string]entry[user]{}},
		authz:  cache[bool]{now: cfg.Now, m: map[string]entry[bool]{}},
	}, nil
}

// Close releases the idle connections to the API server.
func (g *Guard) Close() error {
	g.client.CloseIdleConnections()
	return nil
}

// Wrap returns next behind the checks. The answers are upstream's: 401
// "Unauthorized" without a valid bearer token, 403 "Authorization denied
// for user <u>" when the access review does not allow, 500 when a review
// cannot be made.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		u, err := g.authenticate(r.Context(), token)
		if err != nil {
			g.cfg.Logger.Error("metrics: authentication failed", "path", r.URL.Path, "err", err)
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if u.Name == "" {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		allowed, err := g.authorize(r.Context(), u, strings.ToLower(r.Method), r.URL.Path)
		if err != nil {
			msg := "Authorization for user " + u.Name + " failed"
			g.cfg.Logger.Error("metrics: "+msg, "path", r.URL.Path, "err", err)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !allowed {
			http.Error(w, "Authorization denied for user "+u.Name, http.StatusForbidden)
			return
		}
		r.Header.Del("Authorization") // as the apiserver's bearer-token authenticator does
		next.ServeHTTP(w, r)
	})
}

// bearer returns the token of an "Authorization: Bearer <token>" header
// (scheme case-insensitive), as the apiserver's bearer-token authenticator
// reads it.
func bearer(r *http.Request) (string, bool) {
	parts := strings.SplitN(strings.TrimSpace(r.Header.Get("Authorization")), " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

// user is an authenticated user; an empty Name means the token was not
// authenticated.
type user struct {
	Name   string              `json:"username,omitempty"`
	UID    string              `json:"uid,omitempty"`
	Groups []string            `json:"groups,omitempty"`
	Extra  map[string][]string `json:"extra,omitempty"`
}

type tokenReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Token string `json:"token"`
	} `json:"spec"`
	Status struct {
		Authenticated bool   `json:"authenticated"`
		User          user   `json:"user"`
		Error         string `json:"error,omitempty"`
	} `json:"status"`
}

// authenticate returns the token's user (empty Name when the API server
// says it is not authenticated), from the cache when it can.
func (g *Guard) authenticate(ctx context.Context, token string) (user, error) {
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if u, ok := g.authn.get(key); ok {
		return u, nil
	}
	var tr tokenReview
	tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
	tr.Spec.Token = token
	if err := g.post(ctx, tokenReviewPath, &tr, &tr); err != nil {
		return user{}, fmt.Errorf("token review: %w", err)
	}
	var u user
	if tr.Status.Authenticated && tr.Status.User.Name != "" {
		u = tr.Status.User
		if !slices.Contains(u.Groups, "system:authenticated") && !slices.Contains(u.Groups, "system:unauthenticated") && u.Name != "system:anonymous" {
			u.Groups = append(slices.Clone(u.Groups), "system:authenticated")
		}
	}
	g.authn.put(key, u, g.cfg.AuthnTTL)
	return u, nil
}

type accessReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		NonResourceAttributes struct {
			Path string `json:"path"`
			Verb string `json:"verb"`
		} `json:"nonResourceAttributes"`
		User   string              `json:"user,omitempty"`
		UID    string              `json:"uid,omitempty"`
		Groups []string            `json:"groups,omitempty"`
		Extra  map[string][]string `json:"extra,omitempty"`
	} `json:"spec"`
	Status struct {
		Allowed         bool   `json:"allowed"`
		Denied          bool   `json:"denied,omitempty"`
		Reason          string `json:"reason,omitempty"`
		EvaluationError string `json:"evaluationError,omitempty"`
	} `json:"status"`
}

// authorize asks whether u may use verb on the non-resource path, from the
// cache when it can.
func (g *Guard) authorize(ctx context.Context, u user, verb, path string) (bool, error) {
	var ar accessReview
	ar.APIVersion, ar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
	ar.Spec.NonResourceAttributes.Path, ar.Spec.NonResourceAttributes.Verb = path, verb
	ar.Spec.User, ar.Spec.UID, ar.Spec.Groups, ar.Spec.Extra = u.Name, u.UID, u.Groups, u.Extra
	key, err := json.Marshal(ar.Spec)
	if err != nil {
		return false, fmt.Errorf("access review: %w", err)
	}
	if allowed, ok := g.authz.get(string(key)); ok {
		return allowed, nil
	}
	if err := g.post(ctx, accessReviewPath, &ar, &ar); err != nil {
		return false, fmt.Errorf("access review: %w", err)
	}
	if ar.Status.Allowed && ar.Status.Denied {
		return false, errors.New("access review: both allowed and denied")
	}
	if ar.Status.Allowed {
		g.authz.put(string(key), true, g.cfg.AllowTTL)
		return true, nil
	}
	g.authz.put(string(key), false, g.cfg.DenyTTL)
	return false, nil
}

// post sends in to the API server and decodes its answer into out,
// retrying a transient failure with back-off, all within cfg.Timeout.
func (g *Guard) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	attempts := 0
	var last error
	review := func() (struct{}, error) {
		attempts++
		retry, err := g.try(ctx, path, body, out)
		last = err
		if err != nil && !retry {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}
	// Upstream's back-off: RetryBackoff, then 1.5 times longer each time,
	// ±20% (uncapped: a wait past Timeout is cut by it anyway).
	exp := &backoff.ExponentialBackOff{InitialInterval: g.cfg.RetryBackoff, RandomizationFactor: 0.2, Multiplier: 1.5, MaxInterval: g.cfg.Timeout}
	_, err = backoff.Retry(ctx, review, backoff.WithBackOff(exp), backoff.WithMaxTries(uint(g.cfg.Retries)), backoff.WithMaxElapsedTime(0))
	if err != nil && !errors.Is(err, last) { // Timeout ran out between two attempts
		return fmt.Errorf("%w (after %d attempts: %w)", last, attempts, ctx.Err())
	}
	return err
}

// try makes one call and says whether its failure is worth retrying.
func (g *Guard) try(ctx context.Context, path string, body []byte, out any) (retry bool, err error) {
	tok, err := os.ReadFile(g.cfg.TokenFile)
	if err != nil {
		return false, fmt.Errorf("service-account token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(g.cfg.Host, "/")+path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := g.client.Do(req)
	if err != nil {
		return errors.Is(err, syscall.ECONNRESET), err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return errors.Is(err, syscall.ECONNRESET), err
	}
	if resp.StatusCode/100 != 2 {
		switch resp.StatusCode {
		case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusGatewayTimeout:
			retry = true
		default:
			retry = resp.Header.Get("Retry-After") != ""
		}
		return retry, fmt.Errorf("API server answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	if err := json.Unmarshal(data, out); err != nil {
		return false, fmt.Errorf("decoding the answer: %w", err)
	}
	return false, nil
}

// maxEntries bounds a cache; past it, expired entries are dropped, and if
// none were, the cache starts over.
const maxEntries = 4096

type entry[V any] struct {
	v   V
	exp time.Time
}

// cache is a map of answers with expiry times.
type cache[V any] struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]entry[V]
}

func (c *cache[V]) get(k string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !c.now().Before(e.exp) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *cache[V]) put(k string, v V, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.m) >= maxEntries {
		for key, e := range c.m {
			if !now.Before(e.exp) {
				delete(c.m, key)
			}
		}
		if len(c.m) >= maxEntries {
			clear(c.m)
		}
	}
	c.m[k] = entry[V]{v: v, exp: now.Add(ttl)}
}
