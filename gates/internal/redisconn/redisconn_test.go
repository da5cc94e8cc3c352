package redisconn

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/testenv"
)

func TestOptionsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"bad address", Config{Address: "nohost"}, "want host:port"},
		{"url and password", Config{Address: "redis://h:1/0", Password: "x"}, "go in the address URL"},
		{"cert without tls", Config{Address: "h:1", TLSCert: "c", TLSKey: "k"}, "need tls=true or a rediss:// address"},
		{"cert without key", Config{Address: "rediss://h:1/0", TLSCert: "c"}, "tls_cert and tls_key go together"},
		{"missing cert file", Config{Address: "h:1", TLS: true, TLSCert: "/nonexistent.pem", TLSKey: "/nonexistent.key"}, "tls_cert/tls_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.c.Options(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Options: %v, want %q", err, tc.want)
			}
		})
	}
}

// A gate's connection reaches a redis-server that listens only on TLS and
// requires a client certificate: with tls_ca_cert, tls_cert and tls_key,
// and not without the certificate.
func TestTLSClientCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := testenv.StartRedisTLS(t)
	for _, tc := range []struct {
		name string
		c    Config
		ok   bool
	}{
		{"rediss url with client cert", Config{Address: srv.URL, TLSCACert: srv.CAFile, TLSCert: srv.CertFile, TLSKey: srv.KeyFile}, true},
		{"host:port with tls and client cert", Config{Address: srv.Addr, TLS: true, TLSCACert: srv.CAFile, TLSCert: srv.CertFile, TLSKey: srv.KeyFile}, true},
		{"no client cert", Config{Address: srv.URL, TLSCACert: srv.CAFile}, false},
		{"untrusted server", Config{Address: srv.URL, TLSCert: srv.CertFile, TLSKey: srv.KeyFile}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.c.Options()
			if err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(o)
			defer c.Close()
			err = c.Ping(context.Background()).Err()
			if (err == nil) != tc.ok {
				t.Errorf("PING: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
