package dispatch

import (
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSetDefaults(t *testing.T) {
	var c Config
	c.SetDefaults()
	if c.Fairness.Header == nil || *c.Fairness.Header != "x-llm-d-inference-fairness-id" || c.Fairness.Attribute != "userid" {
		t.Fatalf("fairness defaults = %+v", c.Fairness)
	}
	c.Fairness = FairnessConfig{} // a pointer: compared above
	want := Config{
		MaxConns:         64,
		RequestTimeout:   5 * time.Minute,
		DeadlineHeader:   "x-request-deadline",
		TimeoutHeader:    "x-envoy-upstream-rq-timeout-ms",
		MaxResponseBytes: 64 << 20,
		Protocol:         ProtocolAuto,
	}
	if c != want {
		t.Fatalf("defaults = %+v, want %+v", c, want)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	off := ""
	kept := Config{MaxConns: 3, RequestTimeout: time.Second, DeadlineHeader: "off", TimeoutHeader: "-", MaxResponseBytes: 10, Protocol: ProtocolH2C,
		Fairness: FairnessConfig{Header: &off, Attribute: "tenant"}}
	c = kept
	c.SetDefaults()
	if c != kept || *c.Fairness.Header != "" {
		t.Fatalf("SetDefaults changed set fields: %+v", c)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string
	}{
		{"ok", func(*Config) {}, ""},
		{"headers off", func(c *Config) { c.DeadlineHeader, c.TimeoutHeader = "off", "-" }, ""},
		{"negative conns", func(c *Config) { c.MaxConns = -1 }, "max conns -1"},
		{"negative per host", func(c *Config) { c.MaxConnsPerHost = -1 }, "max conns per host"},
		{"negative timeout", func(c *Config) { c.RequestTimeout = -time.Second }, "request timeout"},
		{"negative body cap", func(c *Config) { c.MaxResponseBytes = -1 }, "max response bytes"},
		{"cert without key", func(c *Config) { c.TLS.Cert = "c.pem" }, "cert and key"},
		{"key without cert", func(c *Config) { c.TLS.Key = "k.pem" }, "cert and key"},
		{"bad deadline header", func(c *Config) { c.DeadlineHeader = "x deadline" }, "not a valid header name"},
		{"reserved timeout header", func(c *Config) { c.TimeoutHeader = "content-length" }, "reserved header"},
		{"same header twice", func(c *Config) { c.DeadlineHeader, c.TimeoutHeader = "x-t", "X-T" }, "both"},
		{"unknown protocol", func(c *Config) { c.Protocol = "spdy" }, `protocol "spdy"`},
		{"fairness off", func(c *Config) { c.Fairness.Header = ptr("") }, ""},
		{"fairness custom", func(c *Config) { c.Fairness.Header = ptr("X-Tenant") }, ""},
		{"fairness bad name", func(c *Config) { c.Fairness.Header = ptr("x tenant") }, `fairness_header: "x tenant" is not a valid header name`},
		{"fairness reserved", func(c *Config) { c.Fairness.Header = ptr("Content-Type") }, `fairness_header: "Content-Type" is a header`},
		{"fairness is deadline", func(c *Config) { c.Fairness.Header = ptr("X-Request-Deadline") }, "also the deadline or timeout header"},
		{"fairness is timeout", func(c *Config) { c.Fairness.Header = ptr("x-envoy-upstream-rq-timeout-ms") }, "also the deadline or timeout header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			c.SetDefaults()
			tt.mod(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error containing %q", err, tt.wantErr)
			}
			if _, nerr := New(c); nerr == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

// writeServerCA writes the TLS test server's certificate as a PEM file.
func writeServerCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	target := Target{BaseURL: srv.URL}

	t.Run("ca file", func(t *testing.T) {
		c := newClient(t, Config{TLS: TLSConfig{CACert: writeServerCA(t, srv)}})
		out := c.Do(t.Context(), target, newRequest(time.Minute))
		if out.Class != Success || string(out.Body) != `{"ok":true}` {
			t.Fatalf("outcome = %+v", out)
		}
	})
	t.Run("unknown authority is retryable", func(t *testing.T) {
		c := newClient(t, Config{})
		out := c.Do(t.Context(), target, newRequest(time.Minute))
		if out.Class != Retryable || out.StatusCode != 0 || !strings.Contains(out.Err.Error(), "certificate") {
			t.Fatalf("outcome = %+v", out)
		}
	})
	t.Run("insecure skip verify", func(t *testing.T) {
		c := newClient(t, Config{TLS: TLSConfig{InsecureSkipVerify: true}})
		if out := c.Do(t.Context(), target, newRequest(time.Minute)); out.Class != Success {
			t.Fatalf("outcome = %+v", out)
		}
	})
}

// An https gateway is spoken to over HTTP/2 through ALPN, whatever
// Protocol says for http gateways.
func TestTLSHTTP2(t *testing.T) { bothProtocols(t, testTLSHTTP2) }

func testTLSHTTP2(t *testing.T, proto string) {
	protos := make(chan string, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		protos <- r.Proto
		_, _ = w.Write(b)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := newClient(t, Config{TLS: TLSConfig{CACert: writeServerCA(t, srv)}, Protocol: proto})
	req := newRequest(time.Minute)
	req.Headers = map[string]string{"traceparent": "t", "connection": "close"}
	out := c.Do(t.Context(), Target{BaseURL: srv.URL}, req)
	if out.Class != Success || string(out.Body) != string(req.Payload) || out.Refused != 1 {
		t.Fatalf("outcome = %+v", out)
	}
	if p := <-protos; p != "HTTP/2.0" {
		t.Fatalf("https gateway spoken to over %s, want HTTP/2.0", p)
	}
}

// An https gateway that offers only HTTP/1.1 through ALPN is spoken to over
// HTTP/1.1 under http1 and auto (h2c offers only HTTP/2 to https gateways).
func TestTLSHTTP1Only(t *testing.T) {
	for _, proto := range []string{ProtocolHTTP1, ProtocolAuto} {
		t.Run(proto, func(t *testing.T) {
			protos := make(chan string, 4)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				protos <- r.Proto
				_, _ = io.Copy(w, r.Body)
			}))
			srv.EnableHTTP2 = false
			srv.StartTLS()
			t.Cleanup(srv.Close)
			c := newClient(t, Config{TLS: TLSConfig{CACert: writeServerCA(t, srv)}, Protocol: proto})
			req := newRequest(time.Minute)
			if out := c.Do(t.Context(), Target{BaseURL: srv.URL}, req); out.Class != Success || string(out.Body) != string(req.Payload) {
				t.Fatalf("outcome = %+v", out)
			}
			if p := <-protos; p != "HTTP/1.1" {
				t.Fatalf("https gateway spoken to over %s, want HTTP/1.1", p)
			}
		})
	}
}

func TestTLSFileErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		tls  TLSConfig
		want string
	}{
		{"missing ca", TLSConfig{CACert: missing}, missing},
		{"ca without pem", TLSConfig{CACert: garbage}, garbage},
		{"missing cert", TLSConfig{Cert: missing, Key: garbage}, missing},
		{"bad key pair", TLSConfig{Cert: garbage, Key: garbage}, garbage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{TLS: tt.tls})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
