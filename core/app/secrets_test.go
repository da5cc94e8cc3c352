package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// Secrets go everywhere they can: the Redis URL's password, the gateway
// URL's, request headers (Authorization, X-Api-Key) and a header-bearing
// message without an id, a TLS key file, a wrong Redis password and an
// unparsable Redis URL (errors). Then every output — debug logs, returned
// errors, /metrics, /status.json, span attributes and events — is searched
// for them.
func TestSecretsNeverLeak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	const (
		redisPW   = "s3cret-redis-pw-4711"
		wrongPW   = "s3cret-wrong-pw-0815"
		parsePW   = "s3cret-parse-pw-1234"
		gwPW      = "s3cret-gateway-pw-99"
		bearer    = "s3cret-bearer-token-42"
		apiKey    = "s3cret-api-key-77"
		deadToken = "s3cret-dead-letter-auth"
	)
	srv := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPW})
	if !strings.Contains(srv.URL, redisPW) {
		t.Fatalf("test Redis URL %q does not carry the password", srv.URL)
	}
	keyPEM, certFile, keyFile := writeTLSPair(t)
	keySecret := string(keyPEM[40:80]) // a piece of the key's base64 body

	var gotAuth sync.Map
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct{ ID string }
		_ = json.NewDecoder(r.Body).Decode(&p)
		gotAuth.Store(p.ID, r.Header.Get("Authorization")+"|"+r.Header.Get("X-Api-Key"))
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(gw.Close)
	gwURL := strings.Replace(gw.URL, "http://", "http://sluice:"+gwPW+"@", 1)

	logs := &testenv.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ad := NewAdapters()
	if err := ad.Transports.Register(redisstream.Name, redisstream.Factory); err != nil {
		t.Fatal(err)
	}
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	newCfg := func(redisURL string) *config.Config {
		return &config.Config{
			Transport: redisstream.Name, RedisURL: redisURL, Concurrency: 4,
			MetricsPort: testenv.FreePort(t), HealthPort: -1, ListenHost: "127.0.0.1",
			DrainTimeout: config.Duration(time.Second),
			TLS:          config.TLS{Cert: certFile, Key: keyFile},
			TransportConfig: config.TransportConfig{ResultQueueName: "secret-results",
				Options: json.RawMessage(`{"block_ms":50}`),
				Queues:  []config.Queue{{Queue: transport.Queue{Name: "secret-requests"}, IGWBaseURL: gwURL}}},
		}
	}
	var errs []string

	// 1. Traffic with the right password.
	a, err := New(newCfg(srv.URL), Options{Adapters: ad, Logger: log, Registry: prometheus.NewRegistry(), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	rc := testenv.RedisClient(t, srv.URL)
	far := time.Now().Add(time.Minute).Unix()
	for i := range 5 {
		msg := fmt.Sprintf(`{"id":"s%d","deadline":%d,"payload":{"id":"s%d"},"headers":{"Authorization":"Bearer %s","X-Api-Key":"%s"},"metadata":{"job_id":"j"}}`,
			i, far, i, bearer, apiKey)
		if err := rc.XAdd(ctx, xadd("secret-requests", msg)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Without an id: dead-lettered, and the decode failure is logged.
	if err := rc.XAdd(ctx, xadd("secret-requests", `{"headers":{"Authorization":"Bearer `+deadToken+`"},"payload":{}}`)).Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "five results", func() bool { return rc.LLen(ctx, "secret-results").Val() >= 5 })
	if v, _ := gotAuth.Load("s0"); v != "Bearer "+bearer+"|"+apiKey {
		t.Fatalf("the gateway got %q: the credential headers did not travel, so the test proves nothing", v)
	}
	metricsText := getText(t, "http://"+a.Addr("metrics")+"/metrics")
	statusJSON := getText(t, "http://"+a.Addr("metrics")+"/status.json")
	stop()
	if err := <-errc; err != nil {
		errs = append(errs, err.Error())
	}

	// 2. A wrong password: the claims fail and are logged, for a while.
	a2, err := New(newCfg(strings.Replace(srv.URL, redisPW, wrongPW, 1)), Options{Adapters: ad, Logger: log, Registry: prometheus.NewRegistry()})
	if err != nil {
		errs = append(errs, err.Error())
	} else {
		ctx2, stop2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		if err := a2.Run(ctx2); err != nil {
			errs = append(errs, err.Error())
		}
		stop2()
	}
	// 3. A URL that does not parse, with a password in it.
	if _, err := New(newCfg("redis://sluice:"+parsePW+"@127.0.0.1:notaport/0"), Options{Adapters: ad, Logger: log, Registry: prometheus.NewRegistry()}); err != nil {
		errs = append(errs, err.Error())
	} else {
		t.Error("an unparsable Redis URL was accepted")
	}

	var spans strings.Builder
	for _, s := range exp.GetSpans() {
		fmt.Fprintf(&spans, "%s %v %v %v\n", s.Name, s.Attributes, s.Events, s.Status)
	}
	outputs := map[string]string{
		"logs": logs.String(), "errors": strings.Join(errs, "\n"), "/metrics": metricsText,
		"/status.json": statusJSON, "spans": spans.String(),
	}
	if os.Getenv("SLUICE_SHOW_OUTPUTS") != "" {
		for name, out := range outputs {
			t.Logf("=== %s\n%s", name, out)
		}
	}
	for name, out := range outputs {
		if out == "" && name != "errors" {
			t.Errorf("%s: empty, so nothing was searched", name)
		}
	}
	if !strings.Contains(outputs["logs"]+outputs["errors"], "WRONGPASS") {
		t.Errorf("the wrong password left no trace in logs or errors; the test did not make errors happen:\n%s", outputs["errors"])
	}
	for _, secret := range []string{redisPW, wrongPW, parsePW, gwPW, bearer, apiKey, deadToken, keySecret} {
		for name, out := range outputs {
			if i := strings.Index(out, secret); i >= 0 {
				t.Errorf("secret %q found in %s: …%s…", secret, name, out[max(0, i-120):min(len(out), i+len(secret)+40)])
			}
		}
	}
}

// xadd is an XADD of a request in watermill-redisstream's format.
func xadd(stream, payload string) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: stream, Values: []any{"_watermill_message_uuid", fmt.Sprint(time.Now().UnixNano()), "payload", payload}}
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// writeTLSPair writes a self-signed certificate and its key to files.
func writeTLSPair(t *testing.T) (keyPEM []byte, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return keyPEM, certFile, keyFile
}
