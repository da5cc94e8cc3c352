package redisbudget_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/redisbudget"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func registry(t testing.TB) *gate.Registry {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(redisbudget.Type, redisbudget.Factory); err != nil {
		t.Fatal(err)
	}
	return r
}

// build builds a gate from JSON gate_params through the registry, as app does.
func build(t testing.TB, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	return gatetest.Build(t, registry(t), redisbudget.Type, params, env)
}

func mustBuild(t testing.TB, params string) gate.Gate {
	t.Helper()
	g, err := build(t, params, gate.Env{})
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

func TestBudgetValues(t *testing.T) {
	mr := miniredis.RunT(t)
	g := mustBuild(t, `{"address":"`+mr.Addr()+`"}`)
	tests := []struct {
		name  string
		value *string
		want  float64
	}{
		{"missing key is open", nil, 1},
		{"zero", ptr("0"), 0},
		{"half", ptr("0.5"), 0.5},
		{"spaces", ptr(" 0.25 "), 0.25},
		{"above one is clamped", ptr("3"), 1},
		{"negative is clamped", ptr("-0.5"), 0},
		{"unparsable is open (upstream)", ptr("soon"), 1},
		{"NaN is open", ptr("NaN"), 1},
		{"tiny positive stays positive", ptr("0.001"), 0.001},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mr.Del(redisbudget.DefaultBudgetKey)
			if tt.value != nil {
				if err := mr.Set(redisbudget.DefaultBudgetKey, *tt.value); err != nil {
					t.Fatal(err)
				}
			}
			b, err := gatetest.Query(t, g)
			if err != nil || b != tt.want {
				t.Fatalf("Budget = %v, %v; want %v", b, err, tt.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestParams(t *testing.T) {
	tests := []struct {
		name    string
		params  string
		env     gate.Env
		wantErr string
	}{
		{"host:port", `{"address":"127.0.0.1:6379"}`, gate.Env{}, ""},
		{"numbers as strings or numbers", `{"address":"127.0.0.1:6379","db":"2","refresh_interval":0.1}`, gate.Env{}, ""},
		{"url from env", `{}`, gate.Env{RedisURL: "redis://:pw@127.0.0.1:6379/1"}, ""},
		{"rediss url", `{"address":"rediss://127.0.0.1:6380","tls_insecure_skip_verify":"true"}`, gate.Env{}, ""},
		{"tls host:port", `{"address":"127.0.0.1:6380","tls":true,"password":"pw","username":"u"}`, gate.Env{}, ""},
		{"failure policy", `{"address":"127.0.0.1:6379","failure_policy":"keep-last"}`, gate.Env{}, ""},
		{"no address", `{}`, gate.Env{}, "no Redis address"},
		{"unknown param", `{"address":"127.0.0.1:6379","bugdet_key":"x"}`, gate.Env{}, "unknown gate_params: bugdet_key"},
		{"bad address", `{"address":"localhost"}`, gate.Env{}, "want host:port"},
		{"password with url", `{"address":"redis://127.0.0.1:6379","password":"x"}`, gate.Env{}, "go in the address URL"},
		{"bad db", `{"address":"127.0.0.1:6379","db":"one"}`, gate.Env{}, "not a number"},
		{"bad tls", `{"address":"127.0.0.1:6379","tls":"maybe"}`, gate.Env{}, "not a boolean"},
		{"skip verify without tls", `{"address":"127.0.0.1:6379","tls_insecure_skip_verify":true}`, gate.Env{}, "need tls=true"},
		{"bad policy", `{"address":"127.0.0.1:6379","failure_policy":"ajar"}`, gate.Env{}, "unknown failure policy"},
		{"bad interval", `{"address":"127.0.0.1:6379","refresh_interval":"soon"}`, gate.Env{}, "not a duration"},
		{"missing CA file", `{"address":"rediss://127.0.0.1:6380","tls_ca_cert":"/nonexistent.pem"}`, gate.Env{}, "tls_ca_cert"},
		{"cluster url", `{"address":"redis://127.0.0.1:7000?addr=127.0.0.1:7001","redis_mode":"cluster"}`, gate.Env{}, ""},
		{"cluster from env", `{}`, gate.Env{RedisURL: "redis://127.0.0.1:7000?addr=127.0.0.1:7001", RedisMode: "cluster"}, ""},
		{"single overrides env", `{"address":"127.0.0.1:6379","db":1,"redis_mode":"single"}`, gate.Env{RedisMode: "cluster"}, ""},
		{"cluster url in single mode", `{"address":"redis://127.0.0.1:7000?addr=127.0.0.1:7001"}`, gate.Env{}, "set the redis mode to cluster"},
		{"db in cluster mode", `{"address":"127.0.0.1:7000","db":1}`, gate.Env{RedisMode: "cluster"}, "db must be 0 with a Redis Cluster"},
		{"unknown redis mode", `{"address":"127.0.0.1:6379","redis_mode":"replicated"}`, gate.Env{}, `gate_params.redis_mode, redis_addrs, redis_master_name: redis mode "replicated"`},
		{"sentinel without master name", `{"address":"127.0.0.1:26379","redis_mode":"sentinel"}`, gate.Env{}, `needs master_name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params, tt.env)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestGenericParams(t *testing.T) {
	g := mustBuild(t, `{"address":"127.0.0.1:6379","failure_policy":"open","refresh_interval":"250ms"}`)
	if p := gate.PolicyOf(g); p != gate.FailOpen {
		t.Errorf("policy %q, want open", p)
	}
	if iv := gate.IntervalOf(g); iv != 250*time.Millisecond {
		t.Errorf("interval %v, want 250ms", iv)
	}
	d := mustBuild(t, `{"address":"127.0.0.1:6379"}`)
	if p := gate.PolicyOf(d); p != gate.FailClosed {
		t.Errorf("default policy %q, want closed (upstream: 0 on Redis errors)", p)
	}
	if iv := gate.IntervalOf(d); iv != redisbudget.DefaultRefreshInterval {
		t.Errorf("default interval %v", iv)
	}
	if s := d.(gate.Describer).Describe(); !strings.Contains(s, redisbudget.DefaultBudgetKey) {
		t.Errorf("Describe = %q, want the key named", s)
	}
}

func TestConformance(t *testing.T) {
	mr := miniredis.RunT(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"address":"`+mr.Addr()+`","budget_key":"conf"}`)
	}, gatetest.Features{
		Set: func(t testing.TB, b float64) {
			if err := mr.Set("conf", strconv.FormatFloat(b, 'g', -1, 64)); err != nil {
				t.Fatal(err)
			}
		},
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"address":"127.0.0.1:`+strconv.Itoa(testenv.FreePort(t))+`"}`)
		},
		Hanging: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"address":"`+silentServer(t)+`"}`)
		},
	})
}

// silentServer accepts connections and never answers.
func silentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestRefresherPolicies runs the gate under the Refresher against a Redis
// that goes away: closed by default, open or keep-last when configured.
func TestRefresherPolicies(t *testing.T) {
	tests := []struct {
		policy string
		want   float64
	}{{"", 0}, {"closed", 0}, {"open", 1}, {"keep-last", 0.4}}
	for _, tt := range tests {
		t.Run("policy="+tt.policy, func(t *testing.T) {
			mr := miniredis.RunT(t)
			_ = mr.Set(redisbudget.DefaultBudgetKey, "0.4")
			params := `{"address":"` + mr.Addr() + `"`
			if tt.policy != "" {
				params += `,"failure_policy":"` + tt.policy + `"`
			}
			g := mustBuild(t, params+`}`)
			var failures int
			r := gate.NewRefresher(g, gate.RefresherConfig{Name: "redis", Interval: 10 * time.Millisecond,
				Observe: func(_ float64, err error) {
					if err != nil {
						failures++
					}
				}})
			r.Start(context.Background())
			defer r.Close()
			if b := r.Budget(); b != 0.4 {
				t.Fatalf("budget %v before the outage, want 0.4", b)
			}
			mr.Close()
			waitFor(t, 3*time.Second, func() bool { return r.Budget() == tt.want }, "budget under policy")
		})
	}
}

func waitFor(t testing.TB, within time.Duration, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRealRedisAuth runs against a real redis-server with requirepass.
func TestRealRedisAuth(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{Password: "s3cret"})
	admin := redis.NewClient(&redis.Options{Addr: rs.Addr, Password: rs.Password})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Set(ctx, "gate:budget", "0.3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		params  string
		env     gate.Env
		want    float64
		wantErr string
	}{
		{"url with password", `{"address":"` + rs.URL + `","budget_key":"gate:budget"}`, gate.Env{}, 0.3, ""},
		{"REDIS_URL from env", `{"budget_key":"gate:budget"}`, gate.Env{RedisURL: rs.URL}, 0.3, ""},
		{"host:port with password param", `{"address":"` + rs.Addr + `","password":"s3cret","budget_key":"gate:budget"}`, gate.Env{}, 0.3, ""},
		{"missing key with auth", `{"address":"` + rs.URL + `","budget_key":"absent"}`, gate.Env{}, 1, ""},
		{"wrong password", `{"address":"` + rs.Addr + `","password":"nope","budget_key":"gate:budget"}`, gate.Env{}, 0, "WRONGPASS"},
		{"no password", `{"address":"` + rs.Addr + `","budget_key":"gate:budget"}`, gate.Env{}, 0, "NOAUTH"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := build(t, tt.params, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			b, err := gatetest.Query(t, g)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Budget = %v, %v; want an error containing %q", b, err, tt.wantErr)
				}
				return
			}
			if err != nil || b != tt.want {
				t.Fatalf("Budget = %v, %v; want %v", b, err, tt.want)
			}
		})
	}
	t.Run("conformance", func(t *testing.T) {
		gatetest.Run(t, func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"address":"`+rs.URL+`","budget_key":"conf"}`)
		}, gatetest.Features{Set: func(t testing.TB, b float64) {
			if err := admin.Set(ctx, "conf", strconv.FormatFloat(b, 'g', -1, 64), 0).Err(); err != nil {
				t.Fatal(err)
			}
		}})
	})
}

// TestTLS reads the key over TLS (rediss:// URL and host:port with tls=true),
// trusting a CA file.
func TestTLS(t *testing.T) {
	caFile, srvCfg := selfSigned(t)
	mr, err := miniredis.RunTLS(srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	_ = mr.Set(redisbudget.DefaultBudgetKey, "0.7")
	for _, params := range []string{
		`{"address":"rediss://` + mr.Addr() + `","tls_ca_cert":"` + caFile + `"}`,
		`{"address":"` + mr.Addr() + `","tls":"true","tls_ca_cert":"` + caFile + `"}`,
		`{"address":"` + mr.Addr() + `","tls":true,"tls_insecure_skip_verify":true}`,
	} {
		b, err := gatetest.Query(t, mustBuild(t, params))
		if err != nil || b != 0.7 {
			t.Errorf("%s: Budget = %v, %v; want 0.7", params, b, err)
		}
	}
	// Without the CA the certificate is refused.
	if b, err := gatetest.Query(t, mustBuild(t, `{"address":"rediss://`+mr.Addr()+`"}`)); err == nil {
		t.Errorf("untrusted certificate accepted (budget %v)", b)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and returns the
// PEM file and a server TLS config.
func selfSigned(t testing.TB) (string, *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return file, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// TestMutualTLS reads the key from a real redis-server that listens on a
// TLS port only and requires a client certificate.
func TestMutualTLS(t *testing.T) {
	rs := testenv.StartRedisTLS(t)
	admin := redis.NewClient(&redis.Options{Addr: rs.Addr, TLSConfig: rs.ClientTLS(t)})
	defer admin.Close()
	if err := admin.Set(context.Background(), redisbudget.DefaultBudgetKey, "0.4", 0).Err(); err != nil {
		t.Fatal(err)
	}
	with := `{"address":"` + rs.URL + `","tls_ca_cert":"` + rs.CAFile + `","tls_cert":"` + rs.CertFile + `","tls_key":"` + rs.KeyFile + `"}`
	if b, err := gatetest.Query(t, mustBuild(t, with)); err != nil || b != 0.4 {
		t.Errorf("with a client certificate: Budget = %v, %v; want 0.4", b, err)
	}
	without := `{"address":"` + rs.URL + `","tls_ca_cert":"` + rs.CAFile + `"}`
	if b, err := gatetest.Query(t, mustBuild(t, without)); err == nil {
		t.Errorf("without a client certificate: Budget = %v, want an error", b)
	}
	if _, err := build(t, `{"address":"`+rs.URL+`","tls_cert":"`+rs.CertFile+`"}`, gate.Env{}); err == nil {
		t.Error("tls_cert without tls_key accepted")
	}
}
