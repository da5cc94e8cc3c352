package deploy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"go.yaml.in/yaml/v3"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/internal/testenv"
)

// buildSluice builds cmd/sluice into a temporary directory.
func buildSluice(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sluice: %v\n%s", err, out)
	}
	return bin
}

// ciServers are the real servers the values files run against.
type ciServers struct {
	redisURL, prometheusURL, emulator string
}

// startCIServers starts the servers the values files need: redis-server
// unless all use Pub/Sub, Prometheus when one names ap.prometheusURL, the
// Pub/Sub emulator when one uses gcp-pubsub. They stop when t ends.
func startCIServers(t *testing.T, vals []ciValues) *ciServers {
	t.Helper()
	s := &ciServers{}
	for _, v := range vals {
		transport, _ := v.transport()
		if transport != "gcp-pubsub" && s.redisURL == "" {
			s.redisURL = testenv.StartRedis(t, testenv.RedisOptions{}).URL
		}
		if transport == "gcp-pubsub" && s.emulator == "" {
			s.emulator = testenv.StartPubSubEmulator(t)
		}
		if v.AP.PrometheusURL != "" && s.prometheusURL == "" {
			s.prometheusURL = testenv.StartPrometheus(t, nil, time.Second).URL
		}
	}
	return s
}

// Every values file of helm/sluice/ci, rendered by the chart, starts the
// built sluice binary: the container's command, arguments and environment
// as rendered, the ConfigMap and Secret files it mounts written to a
// temporary directory (the mount paths in the arguments rewritten to it),
// against a real redis-server, Prometheus and Pub/Sub emulator. The test
// points the chart at them through values (ap.redis.url,
// ap.prometheusURL, and a PUBSUB_EMULATOR_HOST in sluice.extraEnv), picks
// free ports (ap.health.port, ap.metrics.port) and binds them to 127.0.0.1
// (--listen-host in sluice.extraArgs). sluice must log the transport and the
// number of queues the file configures, answer /readyz with 200, serve
// /metrics, and stop cleanly on SIGTERM.
func TestCIValuesStartSluice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sluice binary against real servers; skipped with -short")
	}
	t.Parallel()
	files := ciFiles(t)
	vals := make([]ciValues, len(files))
	for i, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(raw, &vals[i]); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	helm(t)
	bin := buildSluice(t)
	servers := startCIServers(t, vals)
	for i, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			runCIValues(t, bin, servers, f, vals[i])
		})
	}
}

// ciValues are the parts of a values file the test reads.
type ciValues struct {
	AP struct {
		Transport        string         `yaml:"transport"`
		TransportConfig  map[string]any `yaml:"transportConfig"`
		MessageQueueImpl string         `yaml:"messageQueueImpl"`
		PrometheusURL    string         `yaml:"prometheusURL"`
		Redis            struct {
			Enabled      bool             `yaml:"enabled"`
			QueuesConfig []map[string]any `yaml:"queuesConfig"`
		} `yaml:"redis"`
		GCPPubSub struct {
			Enabled             bool             `yaml:"enabled"`
			ProjectID           string           `yaml:"projectId"`
			RequestSubscriberID string           `yaml:"requestSubscriberId"`
			ResultTopicID       string           `yaml:"resultTopicId"`
			TopicsConfig        []map[string]any `yaml:"topicsConfig"`
		} `yaml:"gcpPubSub"`
		TLS struct {
			SecretName string `yaml:"secretName"`
			CACertKey  string `yaml:"caCertKey"`
			CertKey    string `yaml:"certKey"`
			KeyKey     string `yaml:"keyKey"`
		} `yaml:"tls"`
	} `yaml:"ap"`
	Sluice struct {
		Config struct {
			Transport       string `yaml:"transport"`
			TransportConfig struct {
				Queues []map[string]any `yaml:"queues"`
			} `yaml:"transport_config"`
		} `yaml:"config"`
		StatusPage *bool            `yaml:"statusPage"`
		ExtraArgs  []string         `yaml:"extraArgs"`
		ExtraEnv   []map[string]any `yaml:"extraEnv"`
	} `yaml:"sluice"`
}

// transport returns the transport and the number of queues the values
// configure.
func (v ciValues) transport() (string, int) {
	switch {
	case v.Sluice.Config.Transport != "":
		return v.Sluice.Config.Transport, len(v.Sluice.Config.TransportConfig.Queues)
	case v.AP.Transport != "":
		queues, _ := v.AP.TransportConfig["queues"].([]any)
		topics, _ := v.AP.TransportConfig["topics"].([]any)
		return v.AP.Transport, len(queues) + len(topics)
	case v.AP.Redis.Enabled:
		name := "redis-pubsub"
		if v.AP.MessageQueueImpl == "redis-sortedset" {
			name = "redis-sortedset"
		}
		return name, max(1, len(v.AP.Redis.QueuesConfig))
	case v.AP.GCPPubSub.Enabled:
		return "gcp-pubsub", max(1, len(v.AP.GCPPubSub.TopicsConfig))
	}
	return "redis-pubsub", 1
}

// urlSecret returns ap.transportConfig.urlSecret (nil without ap.transport).
func (v ciValues) urlSecret() map[string]any {
	if v.AP.Transport == "" {
		return nil
	}
	us, _ := v.AP.TransportConfig["urlSecret"].(map[string]any)
	return us
}

// pubsub returns the project, the result topic and the request
// subscriptions of a gcp-pubsub values file, from ap.transportConfig or the
// deprecated ap.gcpPubSub.
func (v ciValues) pubsub() (project, resultTopic string, subs, resultTopics []string) {
	topics := v.AP.GCPPubSub.TopicsConfig
	project, resultTopic = v.AP.GCPPubSub.ProjectID, v.AP.GCPPubSub.ResultTopicID
	if v.AP.Transport != "" {
		project, resultTopic = str(v.AP.TransportConfig["project_id"]), str(v.AP.TransportConfig["result_topic_id"])
		topics = nil
		list, _ := v.AP.TransportConfig["topics"].([]any)
		for _, e := range list {
			m, _ := e.(map[string]any)
			topics = append(topics, m)
		}
	} else if len(topics) == 0 {
		subs = []string{v.AP.GCPPubSub.RequestSubscriberID}
	}
	for _, tc := range topics {
		subs = append(subs, str(tc["subscriber_id"]))
		if r := str(tc["result_topic_id"]); r != "" {
			resultTopics = append(resultTopics, r)
		}
	}
	return project, resultTopic, subs, resultTopics
}

// retiredFlags are the argument prefixes upstream's chart no longer renders
// (UPSTREAM-v0.10.md §6), on the new values and the deprecated ones alike.
var retiredFlags = []string{"--message-queue-impl", "--redis.", "--pubsub.", "--redis-tracing", "--request-merge-policy-config="}

func runCIValues(t *testing.T, bin string, servers *ciServers, file string, v ciValues) {
	health, metrics := testenv.FreePort(t), testenv.FreePort(t)
	flags := []string{"-f", file,
		"--set", "ap.health.port=" + strconv.Itoa(health),
		"--set", "ap.metrics.port=" + strconv.Itoa(metrics),
		"--set", "ap.metrics.secure=false",
		"--set-json", "sluice.extraArgs=" + mustJSON(t, append(v.Sluice.ExtraArgs, "--listen-host=127.0.0.1")),
	}
	transport, queues := v.transport()
	// The Redis connection, where the file puts it: a literal urlSecret.url
	// or an inline url is replaced by the test's server; an existing Secret
	// (urlSecret.name) is one the test provides, as the operator would;
	// otherwise the deprecated ap.redis.url.
	external := map[string]map[string]string{}
	if transport != "gcp-pubsub" {
		us := v.urlSecret()
		switch {
		case us["url"] != nil:
			flags = append(flags, "--set", "ap.transportConfig.urlSecret.url="+servers.redisURL)
		case us["name"] != nil:
			key := str(us["key"])
			if key == "" {
				key = "url"
			}
			external[str(us["name"])] = map[string]string{key: servers.redisURL}
		case v.AP.Transport != "" && v.AP.TransportConfig["url"] != nil:
			flags = append(flags, "--set", "ap.transportConfig.url="+servers.redisURL)
		default:
			flags = append(flags, "--set", "ap.redis.url="+servers.redisURL)
		}
	}
	if v.AP.PrometheusURL != "" {
		flags = append(flags, "--set", "ap.prometheusURL="+servers.prometheusURL)
	}
	if transport == "gcp-pubsub" {
		addr := servers.emulator
		project, resultTopic, subs, resultTopics := v.pubsub()
		createPubSub(t, addr, project, append([]string{resultTopic}, resultTopics...), subs)
		env := append(v.Sluice.ExtraEnv, map[string]any{"name": "PUBSUB_EMULATOR_HOST", "value": addr})
		flags = append(flags, "--set-json", "sluice.extraEnv="+mustJSON(t, env))
	}
	objs := render(t, flags...)
	d := deploymentOf(t, objs)
	c := d.container()
	dir := t.TempDir()

	// The files the container mounts, and the arguments rewritten to them.
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		vol := d.Spec.Template.Spec.volume(m.Name)
		if vol == nil {
			t.Fatalf("mount %s names no volume", m.Name)
		}
		local := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(local, 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case vol.ConfigMap != nil:
			cm := objs.find("ConfigMap", vol.ConfigMap.Name)
			if cm == nil {
				t.Fatalf("volume %s: ConfigMap %s is not rendered", m.Name, vol.ConfigMap.Name)
			}
			writeData(t, local, cm.get("data"))
		case vol.Secret != nil && objs.find("Secret", vol.Secret.SecretName) != nil:
			s := objs.find("Secret", vol.Secret.SecretName)
			writeData(t, local, s.get("stringData"))
		case vol.Secret != nil && vol.Secret.SecretName == v.AP.TLS.SecretName:
			writeTLS(t, local, v.AP.TLS.CACertKey, v.AP.TLS.CertKey, v.AP.TLS.KeyKey)
		case vol.EmptyDir != nil:
		default:
			t.Fatalf("volume %+v: the test cannot provide it", vol)
		}
		mounts[m.MountPath] = local
	}
	// One pass, longest mount path first, only where a path starts (the
	// argument's start or after "="): a rewritten path is not rewritten again.
	paths := make([]string, 0, len(mounts))
	for p := range mounts {
		paths = append(paths, regexp.QuoteMeta(p))
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	mountRE := regexp.MustCompile(`(^|=)(` + strings.Join(paths, "|") + `)/`)
	rewrite := func(s string) string {
		if len(paths) == 0 {
			return s
		}
		return mountRE.ReplaceAllStringFunc(s, func(m string) string {
			sub := mountRE.FindStringSubmatch(m)
			return sub[1] + mounts[sub[2]] + "/"
		})
	}

	// The environment, resolved as the kubelet does.
	env := resolveEnv(t, objs, external, c)
	if len(c.EnvFrom) > 0 {
		t.Fatalf("envFrom %v: the test cannot provide it", c.EnvFrom)
	}
	if len(c.Command) != 1 || (c.Command[0] != "/sluice" && c.Command[0] != "/llm-d-async") {
		t.Fatalf("command %q: want /sluice or /llm-d-async, which the image provides", c.Command)
	}
	var args []string
	for _, a := range c.Args {
		args = append(args, rewrite(expandVars(a, env)))
		for _, r := range retiredFlags {
			if strings.HasPrefix(a, r) {
				t.Errorf("argument %q: upstream's chart no longer renders %s", a, r)
			}
		}
	}
	if v.Sluice.Config.Transport == "" {
		if got := c.Args[0]; got != "--transport="+transport || c.Args[1] != "--transport-config" {
			t.Errorf("args %q: want --transport=%s --transport-config <document> first", c.Args, transport)
		}
		if _, ok := c.argValue("--gate-wait-timeout"); !ok {
			t.Errorf("args %q: no --gate-wait-timeout", c.Args)
		}
	}
	hasURL := false
	for _, e := range env {
		hasURL = hasURL || (e.name == "REDIS_URL" && e.value == servers.redisURL)
	}
	inline := v.AP.Transport != "" && v.AP.TransportConfig["url"] != nil
	if wantURL := strings.HasPrefix(transport, "redis") && !inline; hasURL != wantURL {
		t.Errorf("REDIS_URL set to the test's server: %v, want %v (env %+v)", hasURL, wantURL, c.Env)
	}
	var environ []string
	for _, e := range env {
		environ = append(environ, e.name+"="+e.value)
	}
	environ = append(environ, "PATH="+os.Getenv("PATH"))

	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	cmd.Dir = dir
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	testenv.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("%s\nsluice %q\nlogs:\n%s", fmt.Sprintf(format, a...), args, logs.String())
	}

	client := &http.Client{Timeout: 3 * time.Second}
	defer client.CloseIdleConnections()
	base := "http://127.0.0.1:" + strconv.Itoa(health)
	deadline := time.Now().Add(45 * time.Second)
	for {
		code, body := get(client, base+"/readyz")
		if code == http.StatusOK {
			break
		}
		select {
		case err := <-exited:
			stopped = true
			fail("sluice exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			fail("/readyz answers %d %s after 45s, want 200", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := get(client, base+"/healthz"); code != http.StatusOK {
		fail("/healthz: %d %s", code, body)
	}
	if code, body := get(client, "http://127.0.0.1:"+strconv.Itoa(metrics)+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		fail("/metrics: %d, want 200 with metrics", code)
	}
	if v.Sluice.StatusPage != nil && *v.Sluice.StatusPage {
		if code, body := get(client, "http://127.0.0.1:"+strconv.Itoa(metrics)+"/status.json"); code != http.StatusOK {
			fail("/status.json: %d %s, want 200 (sluice.statusPage: true)", code, body)
		}
	}
	start := regexp.MustCompile(`sluice starting.*?transport"?[=:]"?([a-z-]+)"?.*?queues"?[=:](\d+)`).FindStringSubmatch(logs.String())
	if start == nil {
		fail("no start line")
	}
	if start[1] != transport || start[2] != strconv.Itoa(queues) {
		fail("sluice started transport %s with %s queue(s), want %s with %d", start[1], start[2], transport, queues)
	}
	if strings.Contains(logs.String(), "legacy flags ignored") {
		fail("sluice ignored the legacy flags the chart rendered")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			fail("sluice exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		fail("sluice did not stop within 30s of SIGTERM")
	}
	t.Logf("sluice %q\n%s", args, logs.String())
}

// syncBuffer is a bytes.Buffer a process writes to while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func get(c *http.Client, url string) (int, string) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	if v == nil {
		return "[]"
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeData writes a ConfigMap's data (or a Secret's stringData) as files.
func writeData(t *testing.T, dir string, data any) {
	t.Helper()
	m, _ := data.(map[string]any)
	for k, v := range m {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(str(v)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

type envEntry struct{ name, value string }

// resolveEnv resolves the container's variables in order: values with
// $(VAR) references to earlier ones expanded, fieldRefs of the pod's name
// and namespace, secretKeyRefs of the Secrets the chart renders and of the
// existing ones in external (name -> key -> value).
func resolveEnv(t *testing.T, objs objects, external map[string]map[string]string, c container) []envEntry {
	t.Helper()
	var env []envEntry
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, envEntry{e.Name, expandVars(e.Value, env)})
		case e.ValueFrom.FieldRef != nil:
			val := map[string]string{"metadata.name": "sluice-ci-0", "metadata.namespace": namespace}[e.ValueFrom.FieldRef.FieldPath]
			if val == "" {
				t.Fatalf("env %s: fieldRef %s unknown to the test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env = append(env, envEntry{e.Name, val})
		case e.ValueFrom.SecretKeyRef != nil && external[e.ValueFrom.SecretKeyRef.Name] != nil:
			val, ok := external[e.ValueFrom.SecretKeyRef.Name][e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				t.Fatalf("env %s: existing Secret %s has no key %s", e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
			}
			env = append(env, envEntry{e.Name, val})
		case e.ValueFrom.SecretKeyRef != nil:
			s := objs.find("Secret", e.ValueFrom.SecretKeyRef.Name)
			if s == nil {
				t.Fatalf("env %s: Secret %s is not rendered", e.Name, e.ValueFrom.SecretKeyRef.Name)
			}
			env = append(env, envEntry{e.Name, str(s.get("stringData." + e.ValueFrom.SecretKeyRef.Key))})
		default:
			t.Fatalf("env %s: valueFrom %+v unknown to the test", e.Name, e.ValueFrom)
		}
	}
	return env
}

// expandVars replaces $(VAR) by the value of an earlier variable, as the
// kubelet does in values and arguments; unknown references stay.
func expandVars(s string, env []envEntry) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
		name := m[2 : len(m)-1]
		for i := len(env) - 1; i >= 0; i-- {
			if env[i].name == name {
				return env[i].value
			}
		}
		return m
	})
}

// writeTLS writes a CA certificate, and a client certificate and key it
// signed, under the keys a TLS Secret would hold.
func writeTLS(t *testing.T, dir, caKey, certKey, keyKey string) {
	t.Helper()
	caPriv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice-ci-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caPriv.PublicKey, caPriv)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "sluice-ci-client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &priv.PublicKey, caPriv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		caKey:   {Type: "CERTIFICATE", Bytes: caDER},
		certKey: {Type: "CERTIFICATE", Bytes: der},
		keyKey:  {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if name == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// createPubSub creates, on the emulator, the topics (result topics) and
// the subscriptions subs (each on a topic of its own) of project.
func createPubSub(t *testing.T, addr, project string, topics, subs []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pubsub.NewClient(ctx, project, option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := func(kind, id string) string {
		if strings.HasPrefix(id, "projects/") {
			return id
		}
		return "projects/" + project + "/" + kind + "/" + id
	}
	ok := func(err error) bool { return err == nil || status.Code(err) == codes.AlreadyExists }
	for _, topic := range topics {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name("topics", topic)}); !ok(err) {
			t.Fatalf("create topic %s: %v", topic, err)
		}
	}
	for _, sub := range subs {
		topic := name("topics", filepath.Base(sub)+"-topic")
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); !ok(err) {
			t.Fatalf("create topic %s: %v", topic, err)
		}
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: name("subscriptions", sub), Topic: topic, AckDeadlineSeconds: 10}); !ok(err) {
			t.Fatalf("create subscription %s: %v", sub, err)
		}
	}
}
