package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// values writes a values file holding text and returns the flags that
// pass it to helm.
func values(t testing.TB, text string) []string {
	t.Helper()
	// Not t.TempDir: helm splits -f on commas, which test names may hold.
	dir, err := os.MkdirTemp("", "sluice-values-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"-f", f}
}

// suite are the values every test of upstream's deployment suite sets
// (UPSTREAM-CHART.md §13): Redis on, a Secret, a gateway URL, a project.
var suite = []string{
	"--set", "ap.redis.enabled=true",
	"--set", "ap.redis.secretName=redis-creds",
	"--set", "ap.igwBaseURL=http://igw:80",
	"--set", "ap.gcpPubSub.projectId=test-project",
}

func withSuite(flags ...string) []string { return append(slices.Clone(suite), flags...) }

// upstreamTail is the common tail of the arguments with the default values
// (UPSTREAM-v0.10.md §6: UPSTREAM-CHART.md §5.2 with --gate-wait-timeout
// after --concurrency).
var upstreamTail = []string{"--concurrency=64", "--gate-wait-timeout=5m", "--drain-timeout=2m", "--health-port=8081", "--metrics-endpoint-auth=false", "--metrics-port=9090"}

// suiteDoc is the document the suite's values translate into: redis-pubsub,
// one queue named request-queue on ap.igwBaseURL.
const suiteDoc = `{"queues":[{"igw_base_url":"http://igw:80","queue_name":"request-queue","request_path_url":"/v1/completions"}]}`

// transportArgs are the first arguments upstream's chart renders now: the
// transport, then its document as a separate argument.
func transportArgs(transport, doc string) []string {
	return []string{"--transport=" + transport, "--transport-config", doc}
}

func wantArgs(t *testing.T, c container, want []string) {
	t.Helper()
	if !slices.Equal(c.Args, want) {
		t.Errorf("args:\n got %q\nwant %q", c.Args, want)
	}
}

// wantDoc checks the transport and the exact document the container gets.
func wantDoc(t *testing.T, c container, transport, doc string) {
	t.Helper()
	if len(c.Args) < 3 || c.Args[0] != "--transport="+transport || c.Args[1] != "--transport-config" {
		t.Fatalf("args %q: want --transport=%s --transport-config <document> first", c.Args, transport)
	}
	if c.Args[2] != doc {
		t.Errorf("transport document:\n got %s\nwant %s", c.Args[2], doc)
	}
}

// docOf decodes the transport document of the container's arguments.
func docOf(t *testing.T, c container) map[string]any {
	t.Helper()
	raw := c.argAfter("--transport-config")
	var doc map[string]any
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatalf("--transport-config %q: %v", raw, err)
	}
	return doc
}

// secretRef returns "<secret>/<key>" of the container's variable name, or
// "" when it is not set from a Secret.
func secretRef(c container, name string) string {
	e := c.env(name)
	if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		return ""
	}
	return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
}

// minimal are the smallest values an install needs since upstream's chart
// requires a transport: gcp-pubsub on the newer values (no Redis, so no
// REDIS_URL and no Secret).
var minimal = []string{"--set", "ap.transport=gcp-pubsub", "--set-json",
	`ap.transportConfig={"project_id":"p","result_topic_id":"results","topics":[{"subscriber_id":"s","igw_base_url":"http://igw:80"}]}`}

// minimalDoc is minimal's document.
const minimalDoc = `{"project_id":"p","result_topic_id":"results","topics":[{"igw_base_url":"http://igw:80","subscriber_id":"s"}]}`

// helm lint passes with every ci/ file; with the defaults it reports
// upstream's "No transport configured" (lint counts a fail as information).
func TestChartLint(t *testing.T) {
	t.Parallel()
	// helm lint reports a template's fail as [INFO] and still passes.
	out, stderr, _ := runHelm(t, "lint", chartDir, "--namespace", namespace)
	if !strings.Contains(out+stderr, "No transport configured") {
		t.Errorf("helm lint (default values): want it to report the failure naming no transport\n%s%s", out, stderr)
	}
	if out, stderr, err := runHelm(t, append([]string{"lint", chartDir, "--namespace", namespace}, minimal...)...); err != nil {
		t.Errorf("helm lint (minimal values): %v\n%s%s", err, out, stderr)
	}
	for _, f := range ciFiles(t) {
		out, stderr, err := runHelm(t, "lint", chartDir, "--namespace", namespace, "-f", f)
		if err != nil {
			t.Errorf("helm lint -f %s: %v\n%s%s", f, err, out, stderr)
		}
	}
}

// With the chart's defaults no transport is configured and the install
// fails, as upstream's chart does now (it used to start the binary on its
// default transport). The smallest values that install (a transport and
// its document) render only the Deployment and its ServiceAccount, with
// the chart's defaults everywhere else.
func TestChartDefaults(t *testing.T) {
	t.Parallel()
	if stderr := renderError(t); !strings.Contains(stderr, "No transport configured: set ap.transport (redis-pubsub|redis-sortedset|gcp-pubsub) with ap.transportConfig, or enable a backend via ap.redis.enabled / ap.gcpPubSub.enabled (deprecated).") {
		t.Errorf("defaults: %s, want upstream's failure naming no transport", stderr)
	}
	objs := render(t, minimal...)
	if got := objs.summary(); got != "ServiceAccount/release-name-sluice, Deployment/release-name-sluice" {
		t.Errorf("rendered %s, want the ServiceAccount and the Deployment", got)
	}
	d := deploymentOf(t, objs)
	c := d.container()
	wantArgs(t, c, append(transportArgs("gcp-pubsub", minimalDoc), upstreamTail...))
	chart := readChart(t)
	if want := "ghcr.io/sluice-io/sluice:" + chart.AppVersion; c.Image != want {
		t.Errorf("image %q, want %q", c.Image, want)
	}
	if !slices.Equal(c.Command, []string{"/sluice"}) {
		t.Errorf("command %q, want [/sluice]", c.Command)
	}
	if c.ImagePullPolicy != "Always" {
		t.Errorf("imagePullPolicy %q, want Always (upstream's default)", c.ImagePullPolicy)
	}
	if c.Name != "sluice" {
		t.Errorf("container name %q, want sluice", c.Name)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "LOG_LEVEL" || c.Env[0].Value != "info" {
		t.Errorf("env %+v, want only LOG_LEVEL=info", c.Env)
	}
	if c.VolumeMounts != nil || d.Spec.Template.Spec.Volumes != nil {
		t.Errorf("volumes %+v / mounts %+v, want none by default", d.Spec.Template.Spec.Volumes, c.VolumeMounts)
	}
	ps := d.Spec.Template.Spec
	if d.Spec.Replicas != 1 || ps.TerminationGracePeriodSeconds != 130 || ps.ServiceAccountName != "release-name-sluice" {
		t.Errorf("replicas %d, grace %d, serviceAccountName %q; want 1, 130, release-name-sluice", d.Spec.Replicas, ps.TerminationGracePeriodSeconds, ps.ServiceAccountName)
	}
	if ps.Affinity != nil || ps.NodeSelector != nil || ps.Tolerations != nil || ps.ImagePullSecrets != nil || ps.PriorityClassName != "" {
		t.Errorf("pod spec %+v: want no affinity, node selector, tolerations, pull secrets or priority class by default", ps)
	}
	// Selector and pod labels: the two selector labels only.
	sel := map[string]string{"app.kubernetes.io/name": "sluice", "app.kubernetes.io/instance": release}
	if !reflect.DeepEqual(d.Spec.Selector.MatchLabels, sel) || !reflect.DeepEqual(d.Spec.Template.Metadata.Labels, sel) {
		t.Errorf("selector %v, pod labels %v, want %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels, sel)
	}
	labels := map[string]string{
		"helm.sh/chart": "sluice-" + chart.Version, "app.kubernetes.io/name": "sluice", "app.kubernetes.io/instance": release,
		"app.kubernetes.io/version": chart.AppVersion, "app.kubernetes.io/managed-by": "Helm",
	}
	for _, o := range objs {
		var m struct {
			Metadata meta `json:"metadata"`
		}
		decode(t, o, &m)
		if !reflect.DeepEqual(m.Metadata.Labels, labels) {
			t.Errorf("%s labels %v, want %v", o.kind(), m.Metadata.Labels, labels)
		}
		if m.Metadata.Namespace == nil || *m.Metadata.Namespace != namespace {
			t.Errorf("%s namespace %v, want %s", o.kind(), m.Metadata.Namespace, namespace)
		}
	}
	// Probes: upstream's defaults.
	want := map[string]probe{
		"startup":   {InitialDelaySeconds: 0, PeriodSeconds: 2, TimeoutSeconds: 3, FailureThreshold: 30},
		"liveness":  {InitialDelaySeconds: 5, PeriodSeconds: 10, TimeoutSeconds: 3, FailureThreshold: 3},
		"readiness": {InitialDelaySeconds: 5, PeriodSeconds: 5, TimeoutSeconds: 3, FailureThreshold: 3},
	}
	paths := map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}
	for name, got := range map[string]probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		w := want[name]
		w.HTTPGet.Path, w.HTTPGet.Port = paths[name], "health"
		if got != w {
			t.Errorf("%s probe %+v, want %+v", name, got, w)
		}
	}
}

// The deployment suite of upstream's chart tests (UPSTREAM-CHART.md §13),
// one subtest per upstream test, plus the serialisation details of §5.3.
func TestChartDeployment(t *testing.T) {
	t.Parallel()
	type check func(t *testing.T, objs objects, d deployment, c container)
	cases := []struct {
		name  string
		flags []string
		check check
	}{
		{"pod security context", nil, func(t *testing.T, _ objects, d deployment, _ container) {
			want := map[string]any{"runAsNonRoot": true, "seccompProfile": map[string]any{"type": "RuntimeDefault"}}
			if !reflect.DeepEqual(d.Spec.Template.Spec.SecurityContext, want) {
				t.Errorf("pod securityContext %v, want %v", d.Spec.Template.Spec.SecurityContext, want)
			}
		}},
		{"container security context defaults", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			want := map[string]any{"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
				"capabilities": map[string]any{"drop": []any{"ALL"}}}
			if !reflect.DeepEqual(c.SecurityContext, want) {
				t.Errorf("securityContext %v, want %v", c.SecurityContext, want)
			}
		}},
		{"container security context override", []string{"--set-json", `ap.securityContext={"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":false,"runAsUser":1000}`},
			func(t *testing.T, _ objects, _ deployment, c container) {
				if c.SecurityContext["readOnlyRootFilesystem"] != false || c.SecurityContext["runAsUser"] != float64(1000) {
					t.Errorf("securityContext %v, want readOnlyRootFilesystem false and runAsUser 1000", c.SecurityContext)
				}
			}},
		{"resources default", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			want := map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "256Mi"}, "limits": map[string]any{"cpu": "500m", "memory": "512Mi"}}
			if !reflect.DeepEqual(c.Resources, want) {
				t.Errorf("resources %v, want %v", c.Resources, want)
			}
		}},
		{"resources override", []string{"--set-json", `ap.resources={"requests":{"cpu":"200m","memory":"512Mi"},"limits":{"cpu":"1000m","memory":"1Gi"}}`},
			func(t *testing.T, _ objects, _ deployment, c container) {
				want := map[string]any{"requests": map[string]any{"cpu": "200m", "memory": "512Mi"}, "limits": map[string]any{"cpu": "1000m", "memory": "1Gi"}}
				if !reflect.DeepEqual(c.Resources, want) {
					t.Errorf("resources %v, want %v", c.Resources, want)
				}
			}},
		{"resources requests only", []string{"--set", "ap.resources.limits=null", "--set", "ap.resources.requests.cpu=50m", "--set", "ap.resources.requests.memory=128Mi"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				want := map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "128Mi"}}
				if !reflect.DeepEqual(c.Resources, want) {
					t.Errorf("resources %v, want %v", c.Resources, want)
				}
			}},
		{"metrics port default", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			if len(c.Ports) != 2 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9090 || c.Ports[0].Protocol != "TCP" ||
				c.Ports[1].Name != "health" || c.Ports[1].ContainerPort != 8081 || c.Ports[1].Protocol != "TCP" || !c.hasArg("--metrics-port=9090") {
				t.Errorf("ports %+v, args %q: want metrics 9090 and health 8081, --metrics-port=9090", c.Ports, c.Args)
			}
		}},
		{"metrics port 8080", []string{"--set", "ap.metrics.port=8080"}, func(t *testing.T, _ objects, _ deployment, c container) {
			if c.Ports[0].ContainerPort != 8080 || !c.hasArg("--metrics-port=8080") {
				t.Errorf("ports %+v, args %q: want 8080", c.Ports, c.Args)
			}
		}},
		// The deprecated values, translated into --transport / --transport-config
		// as upstream's chart does now (these cases used to pin the retired
		// --message-queue-impl / --redis.* / --pubsub.* arguments).
		{"redis-pubsub is the default implementation", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			wantArgs(t, c, append(transportArgs("redis-pubsub", suiteDoc), upstreamTail...))
		}},
		{"any other implementation with redis is redis-pubsub", []string{"--set", "ap.messageQueueImpl=gcp-pubsub"}, func(t *testing.T, _ objects, _ deployment, c container) {
			wantDoc(t, c, "redis-pubsub", suiteDoc)
		}},
		{"redis-sortedset", []string{"--set", "ap.messageQueueImpl=redis-sortedset"}, func(t *testing.T, _ objects, _ deployment, c container) {
			wantArgs(t, c, append(transportArgs("redis-sortedset",
				`{"batch_size":10,"poll_interval_ms":1000,"queues":[{"igw_base_url":"http://igw:80","queue_name":"request-sortedset","request_path_url":"/v1/completions"}],"result_queue_name":"result-list"}`),
				upstreamTail...))
		}},
		{"redis-sortedset numbers and names", []string{"--set", "ap.messageQueueImpl=redis-sortedset", "--set", "ap.redis.requestQueueName=q1", "--set", "ap.redis.resultQueueName=r1",
			"--set", "ap.redis.pollIntervalMs=500", "--set", "ap.redis.batchSize=20", "--set", "ap.redis.requestPathURL=/v1/chat/completions"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "redis-sortedset", `{"batch_size":20,"poll_interval_ms":500,"queues":[{"igw_base_url":"http://igw:80","queue_name":"q1","request_path_url":"/v1/chat/completions"}],"result_queue_name":"r1"}`)
			}},
		{"redis-sortedset empty names fall back", []string{"--set", "ap.messageQueueImpl=redis-sortedset", "--set", "ap.redis.requestQueueName=", "--set", "ap.redis.resultQueueName=",
			"--set", "ap.redis.pollIntervalMs=0", "--set", "ap.redis.batchSize=0", "--set", "ap.concurrency=0", "--set", "ap.drainTimeout="},
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "redis-sortedset", `{"batch_size":10,"poll_interval_ms":1000,"queues":[{"igw_base_url":"http://igw:80","queue_name":"request-sortedset","request_path_url":"/v1/completions"}],"result_queue_name":"result-list"}`)
				if !c.hasArg("--concurrency=64") || !c.hasArg("--drain-timeout=2m") {
					t.Errorf("args %q: want --concurrency=64 and --drain-timeout=2m", c.Args)
				}
			}},
		{"redis-sortedset single-queue gate params are strings", append([]string{"--set", "ap.messageQueueImpl=redis-sortedset", "--set", "ap.redis.gateType=prometheus-query"},
			values(t, "ap:\n  redis:\n    gateParams:\n      query: '1 - inference_extension_flow_control_pool_saturation{inference_pool=\"e2e-pool\"}'\n      fallback: \"0.0\"\n      limit: 40\n      ratio: 0.5\n")...),
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "redis-sortedset", `{"batch_size":10,"poll_interval_ms":1000,"queues":[{"gate_params":{"fallback":"0.0","limit":"40","query":"1 - inference_extension_flow_control_pool_saturation{inference_pool=\"e2e-pool\"}","ratio":"0.5"},"gate_type":"prometheus-query","igw_base_url":"http://igw:80","queue_name":"request-sortedset","request_path_url":"/v1/completions"}],"result_queue_name":"result-list"}`)
			}},
		{"redis-sortedset queues config inline", append([]string{"--set", "ap.messageQueueImpl=redis-sortedset"},
			values(t, `ap:
  redis:
    queuesConfig:
      - queue_name: "saturation-request-sortedset"
        request_path_url: "/v1/completions"
        igw_base_url: "http://envoy.e2e-integration.svc.cluster.local:8081"
        gate_type: "prometheus-saturation"
        gate_params:
          pool: "e2e-pool"
          threshold: "0.7"
`)...), func(t *testing.T, _ objects, _ deployment, c container) {
			wantArgs(t, c, append(transportArgs("redis-sortedset",
				`{"batch_size":10,"poll_interval_ms":1000,"queues":[{"gate_params":{"pool":"e2e-pool","threshold":"0.7"},"gate_type":"prometheus-saturation","igw_base_url":"http://envoy.e2e-integration.svc.cluster.local:8081","queue_name":"saturation-request-sortedset","request_path_url":"/v1/completions"}],"result_queue_name":"result-list"}`),
				upstreamTail...))
		}},
		{"queues config keeps numbers and lists, escapes like toJson", append([]string{"--set", "ap.messageQueueImpl=redis-sortedset"},
			values(t, "ap:\n  redis:\n    queuesConfig:\n      - queue_name: q\n        igw_base_url: \"http://igw:80\"\n        gate_type: local-max-concurrency\n        gate_params:\n          limit: 40\n        labels: {tier: batch}\n        note: \"a<b & c>d\"\n")...),
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "redis-sortedset", `{"batch_size":10,"poll_interval_ms":1000,"queues":[{"gate_params":{"limit":40},"gate_type":"local-max-concurrency","igw_base_url":"http://igw:80","labels":{"tier":"batch"},"note":"a\u003cb \u0026 c\u003ed","queue_name":"q"}],"result_queue_name":"result-list"}`)
			}},
		{"redis-pubsub queues config", values(t, "ap:\n  redis:\n    queuesConfig:\n      - queue_name: ch\n        igw_base_url: \"http://igw:80\"\n"),
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantArgs(t, c, append(transportArgs("redis-pubsub", `{"queues":[{"igw_base_url":"http://igw:80","queue_name":"ch"}]}`), upstreamTail...))
			}},
		{"gcp-pubsub branch", []string{"--set", "ap.redis.enabled=false", "--set", "ap.gcpPubSub.enabled=true"}, func(t *testing.T, _ objects, _ deployment, c container) {
			wantArgs(t, c, append(transportArgs("gcp-pubsub",
				`{"project_id":"test-project","result_topic_id":"","topics":[{"igw_base_url":"http://igw:80","request_path_url":"/v1/completions","subscriber_id":""}]}`), upstreamTail...))
			if c.env("REDIS_URL") != nil {
				t.Errorf("REDIS_URL set on the GCP branch")
			}
		}},
		{"redis wins over gcp", []string{"--set", "ap.gcpPubSub.enabled=true"}, func(t *testing.T, _ objects, _ deployment, c container) {
			wantDoc(t, c, "redis-pubsub", suiteDoc)
		}},
		{"image default", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			if want := "ghcr.io/sluice-io/sluice:" + readChart(t).AppVersion; c.Image != want {
				t.Errorf("image %q, want %q", c.Image, want)
			}
		}},
		{"image tag override", []string{"--set", "ap.image.tag=v1.2.3", "--set", "ap.image.repository=registry.example/sluice"}, func(t *testing.T, _ objects, _ deployment, c container) {
			if c.Image != "registry.example/sluice:v1.2.3" {
				t.Errorf("image %q, want registry.example/sluice:v1.2.3", c.Image)
			}
		}},
		{"igwBaseURL not required with queuesConfig", append([]string{"--set", "ap.igwBaseURL="}, values(t, "ap:\n  redis:\n    queuesConfig:\n      - queue_name: q\n        igw_base_url: \"http://igw:80\"\n")...),
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "redis-pubsub", `{"queues":[{"igw_base_url":"http://igw:80","queue_name":"q"}]}`)
			}},
		{"otel env when the endpoint is set", []string{"--set", "ap.otel.endpoint=http://otel:4317"}, func(t *testing.T, _ objects, _ deployment, c container) {
			got := map[string]string{}
			var names []string
			for _, e := range c.Env {
				names = append(names, e.Name)
				switch {
				case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
					got[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
				case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
					got[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
				default:
					got[e.Name] = e.Value
				}
			}
			want := map[string]string{
				"LOG_LEVEL": "info", "POD_NAME": "fieldRef:metadata.name", "NAMESPACE": "fieldRef:metadata.namespace",
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true",
				"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0", "OTEL_SERVICE_NAME": "llm-d-async",
				"OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=$(NAMESPACE),k8s.pod.name=$(POD_NAME),service.version=" + readChart(t).AppVersion,
				"REDIS_URL":                "secret:redis-creds/url",
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("env %v, want %v", got, want)
			}
			order := []string{"LOG_LEVEL", "POD_NAME", "NAMESPACE", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_INSECURE", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "REDIS_URL"}
			if !slices.Equal(names, order) {
				t.Errorf("env order %q, want %q (POD_NAME and NAMESPACE before the variables that use them)", names, order)
			}
		}},
		{"no otel env when the endpoint is empty", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "OTEL_") || e.Name == "POD_NAME" {
					t.Errorf("env %s set without ap.otel.endpoint", e.Name)
				}
			}
		}},
		// --redis-tracing is retired: redisTracing becomes the document's
		// enable_tracing (it used to render --redis-tracing=true).
		{"redis tracing needs the otel endpoint", []string{"--set", "ap.otel.redisTracing=true"}, func(t *testing.T, _ objects, _ deployment, c container) {
			wantArgs(t, c, append(transportArgs("redis-pubsub", suiteDoc), upstreamTail...))
		}},
		{"redis tracing with the otel endpoint", []string{"--set", "ap.otel.redisTracing=true", "--set", "ap.otel.endpoint=http://otel:4317"}, func(t *testing.T, _ objects, _ deployment, c container) {
			wantArgs(t, c, append(transportArgs("redis-pubsub",
				`{"enable_tracing":true,"queues":[{"igw_base_url":"http://igw:80","queue_name":"request-queue","request_path_url":"/v1/completions"}]}`), upstreamTail...))
		}},
		{"sorted-set tracing", []string{"--set", "ap.messageQueueImpl=redis-sortedset", "--set", "ap.otel.redisTracing=true", "--set", "ap.otel.endpoint=http://otel:4317"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				if doc := docOf(t, c); doc["enable_tracing"] != true {
					t.Errorf("document %v: want enable_tracing true", doc)
				}
			}},
		{"tls volume and flags", []string{"--set", "ap.tls.secretName=my-tls-secret", "--set", "ap.tls.caCertKey=ca.crt", "--set", "ap.tls.certKey=tls.crt",
			"--set", "ap.tls.keyKey=tls.key", "--set", "ap.tls.insecureSkipVerify=true"}, func(t *testing.T, _ objects, d deployment, c container) {
			if m := c.mount("tls-certs"); m == nil || *m != (volumeMount{Name: "tls-certs", MountPath: "/etc/tls", ReadOnly: true}) {
				t.Errorf("mounts %+v, want tls-certs at /etc/tls read-only", c.VolumeMounts)
			}
			if v := d.Spec.Template.Spec.volume("tls-certs"); v == nil || v.Secret == nil || v.Secret.SecretName != "my-tls-secret" {
				t.Errorf("volumes %+v, want tls-certs from Secret my-tls-secret", d.Spec.Template.Spec.Volumes)
			}
			if got := c.Args[len(c.Args)-4:]; !slices.Equal(got, []string{"--tls-insecure-skip-verify=true", "--tls-ca-cert=/etc/tls/ca.crt", "--tls-cert=/etc/tls/tls.crt", "--tls-key=/etc/tls/tls.key"}) {
				t.Errorf("tls args %q", got)
			}
		}},
		{"tls cert needs its key", []string{"--set", "ap.tls.certKey=tls.crt"}, func(t *testing.T, _ objects, _ deployment, c container) {
			if _, ok := c.argValue("--tls-cert"); ok {
				t.Errorf("args %q: --tls-cert without ap.tls.keyKey", c.Args)
			}
		}},
		{"worker pools", values(t, "ap:\n  workerPools:\n    - id: default\n      workers: 8\n"), func(t *testing.T, objs objects, d deployment, c container) {
			if !c.hasArg("--pool-config-file=/etc/llm-d-async/config/worker-pools.json") {
				t.Errorf("args %q: want --pool-config-file", c.Args)
			}
			if m := c.mount("ap-config"); m == nil || *m != (volumeMount{Name: "ap-config", MountPath: "/etc/llm-d-async/config", ReadOnly: true}) {
				t.Errorf("mounts %+v, want ap-config at /etc/llm-d-async/config", c.VolumeMounts)
			}
			if v := d.Spec.Template.Spec.volume("ap-config"); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "release-name-sluice-config" {
				t.Errorf("volumes %+v, want ap-config from release-name-sluice-config", d.Spec.Template.Spec.Volumes)
			}
			cm := objs.find("ConfigMap", "release-name-sluice-config")
			if cm == nil || str(cm.get(`data["worker-pools.json"]`)) != `[{"id":"default","workers":8}]` || len(cm.get("data").(map[string]any)) != 1 {
				t.Errorf("ConfigMap %v, want worker-pools.json only", cm)
			}
		}},
		{"pubsub topics config", append([]string{"--set", "ap.redis.enabled=false", "--set", "ap.gcpPubSub.enabled=true", "--set", "ap.gcpPubSub.resultTopicId=results"},
			values(t, "ap:\n  gcpPubSub:\n    topicsConfig:\n      - subscriber_id: sub-1\n        igw_base_url: \"http://igw:80\"\n")...),
			func(t *testing.T, objs objects, _ deployment, c container) {
				// The topics travel in --transport-config now; no
				// pubsub-topics.json is mounted (it used to be).
				wantArgs(t, c, append(transportArgs("gcp-pubsub",
					`{"project_id":"test-project","result_topic_id":"results","topics":[{"igw_base_url":"http://igw:80","subscriber_id":"sub-1"}]}`), upstreamTail...))
				if cm := objs.find("ConfigMap", "release-name-sluice-config"); cm != nil || c.VolumeMounts != nil {
					t.Errorf("ConfigMap %v, mounts %+v: want neither for the topics", cm, c.VolumeMounts)
				}
			}},
		// Upstream's chart now renders --transport=gcp-pubsub for every
		// gcp-pubsub* messageQueueImpl, with each topic's gate_type in the
		// document, where it gates; the gated auto-select and an explicit
		// gcp-pubsub running gated topics ungated are gone (these cases used
		// to expect --message-queue-impl=gcp-pubsub-gated / gcp-pubsub).
		{"gated topics", append([]string{"--set", "ap.redis.enabled=false", "--set", "ap.gcpPubSub.enabled=true"},
			values(t, "ap:\n  gcpPubSub:\n    topicsConfig:\n      - subscriber_id: a\n      - subscriber_id: b\n        gate_type: prometheus-saturation\n")...),
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "gcp-pubsub", `{"project_id":"test-project","result_topic_id":"","topics":[{"subscriber_id":"a"},{"gate_type":"prometheus-saturation","subscriber_id":"b"}]}`)
			}},
		{"explicit gcp-pubsub keeps the topics' gates", append([]string{"--set", "ap.redis.enabled=false", "--set", "ap.gcpPubSub.enabled=true", "--set", "ap.messageQueueImpl=gcp-pubsub"},
			values(t, "ap:\n  gcpPubSub:\n    topicsConfig:\n      - subscriber_id: b\n        gate_type: prometheus-saturation\n")...),
			func(t *testing.T, _ objects, _ deployment, c container) {
				wantDoc(t, c, "gcp-pubsub", `{"project_id":"test-project","result_topic_id":"","topics":[{"gate_type":"prometheus-saturation","subscriber_id":"b"}]}`)
			}},
		{"explicit gcp-pubsub-gated", []string{"--set", "ap.redis.enabled=false", "--set", "ap.gcpPubSub.enabled=true", "--set", "ap.messageQueueImpl=gcp-pubsub-gated"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				if c.Args[0] != "--transport=gcp-pubsub" {
					t.Errorf("args %q: want --transport=gcp-pubsub", c.Args)
				}
			}},
		{"non-gcp implementation on the gcp branch", []string{"--set", "ap.redis.enabled=false", "--set", "ap.gcpPubSub.enabled=true", "--set", "ap.messageQueueImpl=redis-sortedset"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				if c.Args[0] != "--transport=gcp-pubsub" || c.env("REDIS_URL") != nil {
					t.Errorf("args %q, env %+v: want --transport=gcp-pubsub and no REDIS_URL", c.Args, c.Env)
				}
			}},
		{"transform config", values(t, "ap:\n  transformConfig:\n    requestTransforms:\n      - name: gcs-whisper\n        type: gcs_uri_multipart\n        parameters:\n          providers: [whisper]\n"),
			func(t *testing.T, objs objects, _ deployment, c container) {
				if !c.hasArg("--transform-config-file=/etc/llm-d-async/config/transform-config.json") || c.mount("ap-config") == nil {
					t.Errorf("args %q, mounts %+v: want --transform-config-file and the config mount", c.Args, c.VolumeMounts)
				}
				want := `{"requestTransforms":[{"name":"gcs-whisper","parameters":{"providers":["whisper"]},"type":"gcs_uri_multipart"}]}`
				if cm := objs.find("ConfigMap", "release-name-sluice-config"); cm == nil || str(cm.get(`data["transform-config.json"]`)) != want {
					t.Errorf("ConfigMap %v, want transform-config.json %s", cm, want)
				}
			}},
		{"no transform config", nil, func(t *testing.T, _ objects, _ deployment, c container) {
			if _, ok := c.argValue("--transform-config-file"); ok {
				t.Errorf("args %q: --transform-config-file without ap.transformConfig", c.Args)
			}
		}},
		{"merge policy and worker pools (e2e mt-merge)", values(t, "ap:\n  requestMergePolicyConfig:\n    type: tier-priority\n    parameters:\n      priority_header: x-gateway-priority\n  workerPools:\n    - id: default\n      workers: 1\n"),
			func(t *testing.T, objs objects, _ deployment, c container) {
				tail := c.Args[len(c.Args)-len(upstreamTail)-2:]
				// The merge policy flag is upstream's renamed one now (it used to be
				// the deprecated --request-merge-policy-config).
				if !slices.Equal(tail[:2], []string{"--pool-config-file=/etc/llm-d-async/config/worker-pools.json", "--request-merge-policy-config-file=/etc/llm-d-async/config/request-merge-policy.json"}) {
					t.Errorf("args %q: want the pool file, then the merge policy, before the common tail", c.Args)
				}
				cm := objs.find("ConfigMap", "release-name-sluice-config")
				if cm == nil || str(cm.get(`data["request-merge-policy.json"]`)) != `{"parameters":{"priority_header":"x-gateway-priority"},"type":"tier-priority"}` ||
					str(cm.get(`data["worker-pools.json"]`)) != `[{"id":"default","workers":1}]` {
					t.Errorf("ConfigMap %v", cm)
				}
			}},
		{"prometheus url and cache ttl", []string{"--set", "ap.prometheusURL=http://prom:9090", "--set", "ap.prometheusCacheTTL=0s"}, func(t *testing.T, _ objects, _ deployment, c container) {
			i := slices.Index(c.Args, "--prometheus-url=http://prom:9090")
			if i < 0 || c.Args[i+1] != "--prometheus-cache-ttl=0s" || c.Args[i+2] != "--concurrency=64" {
				t.Errorf("args %q: want --prometheus-url, --prometheus-cache-ttl, then the tail", c.Args)
			}
		}},
		{"affinity absent by default", nil, func(t *testing.T, _ objects, d deployment, _ container) {
			if d.Spec.Template.Spec.Affinity != nil {
				t.Errorf("affinity %v", d.Spec.Template.Spec.Affinity)
			}
		}},
		{"affinity", values(t, "ap:\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n          - matchExpressions:\n              - {key: pool, operator: In, values: [batch]}\n"),
			func(t *testing.T, _ objects, d deployment, _ container) {
				if d.Spec.Template.Spec.Affinity["nodeAffinity"] == nil {
					t.Errorf("affinity %v, want the nodeAffinity", d.Spec.Template.Spec.Affinity)
				}
			}},
		{"redis url creates the secret", []string{"--set", "ap.redis.secretName=", "--set", "ap.redis.url=redis://redis-master.redis.svc:6379"},
			func(t *testing.T, objs objects, _ deployment, c container) {
				e := c.env("REDIS_URL")
				if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "release-name-sluice-redis" || e.ValueFrom.SecretKeyRef.Key != "url" {
					t.Errorf("REDIS_URL %+v, want release-name-sluice-redis/url", e)
				}
				s := objs.find("Secret", "release-name-sluice-redis")
				if s == nil || s.get("type") != "Opaque" || str(s.get("stringData.url")) != "redis://redis-master.redis.svc:6379" {
					t.Errorf("Secret %v", s)
				}
			}},
		{"redis url wins over secretName and its key", []string{"--set", "ap.redis.url=redis://r:6379", "--set", "ap.redis.secretKey=conn"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				if r := c.env("REDIS_URL").ValueFrom.SecretKeyRef; r.Name != "release-name-sluice-redis" || r.Key != "url" {
					t.Errorf("REDIS_URL from %+v, want release-name-sluice-redis/url", r)
				}
			}},
		{"existing secret and key", []string{"--set", "ap.redis.secretKey=conn"}, func(t *testing.T, objs objects, _ deployment, c container) {
			if r := c.env("REDIS_URL").ValueFrom.SecretKeyRef; r.Name != "redis-creds" || r.Key != "conn" {
				t.Errorf("REDIS_URL from %+v, want redis-creds/conn", r)
			}
			if len(objs.ofKind("Secret")) != 0 {
				t.Errorf("a Secret rendered without ap.redis.url")
			}
		}},
		{"log level", []string{"--set", "ap.logging.level=debug"}, func(t *testing.T, _ objects, _ deployment, c container) {
			if e := c.env("LOG_LEVEL"); e == nil || e.Value != "debug" {
				t.Errorf("LOG_LEVEL %+v, want debug", e)
			}
		}},
		{"probe overrides, and 0 falls back as upstream's default does", []string{"--set", "ap.health.port=9000", "--set", "ap.health.livenessProbe.initialDelaySeconds=0",
			"--set", "ap.health.readinessProbe.periodSeconds=7", "--set", "ap.health.startupProbe.failureThreshold=60"},
			func(t *testing.T, _ objects, _ deployment, c container) {
				if c.LivenessProbe.InitialDelaySeconds != 5 || c.ReadinessProbe.PeriodSeconds != 7 || c.StartupProbe.FailureThreshold != 60 {
					t.Errorf("probes %+v %+v %+v", c.StartupProbe, c.LivenessProbe, c.ReadinessProbe)
				}
				if c.Ports[1].ContainerPort != 9000 || !c.hasArg("--health-port=9000") {
					t.Errorf("health port %+v, args %q", c.Ports, c.Args)
				}
			}},
		{"metrics secure", []string{"--set", "ap.metrics.secure=true"}, func(t *testing.T, _ objects, _ deployment, c container) {
			if !c.hasArg("--metrics-endpoint-auth=true") {
				t.Errorf("args %q: want --metrics-endpoint-auth=true", c.Args)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, withSuite(tc.flags...)...)
			d := deploymentOf(t, objs)
			tc.check(t, objs, d, d.container())
		})
	}
}

// Install-time failures: upstream's five, with upstream's messages, and
// sluice's own.
func TestChartValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		flags []string
		want  string
	}{
		{"redis without a connection", []string{"--set", "ap.redis.enabled=true", "--set", "ap.igwBaseURL=http://igw:80"},
			"ap.redis is enabled but no connection is configured: set ap.redis.url, or set ap.redis.secretName/ap.redis.secretKey to reference an existing Secret."},
		{"gcp without a project", []string{"--set", "ap.gcpPubSub.enabled=true", "--set", "ap.igwBaseURL=http://igw:80"},
			"ap.gcpPubSub is enabled but ap.gcpPubSub.projectId is empty: the GCP Pub/Sub backend requires a project ID (the process panics on startup without it)."},
		{"redis without a gateway URL", []string{"--set", "ap.redis.enabled=true", "--set", "ap.redis.secretName=s"},
			"ap.igwBaseURL is required: set it to your inference gateway base URL, or provide per-queue igw_base_url entries via ap.redis.queuesConfig."},
		{"gcp without a gateway URL", []string{"--set", "ap.gcpPubSub.enabled=true", "--set", "ap.gcpPubSub.projectId=p"},
			"ap.igwBaseURL is required: set it to your inference gateway base URL, or provide per-topic igw_base_url entries via ap.gcpPubSub.topicsConfig."},
		{"queuesConfig and gateType", append([]string{"--set", "ap.redis.enabled=true", "--set", "ap.redis.secretName=s", "--set", "ap.messageQueueImpl=redis-sortedset", "--set", "ap.redis.gateType=constant"},
			values(t, "ap:\n  redis:\n    queuesConfig:\n      - queue_name: q\n        igw_base_url: \"http://igw:80\"\n")...),
			"Cannot set both queuesConfig and gateType. Use queuesConfig with per-queue gate_type instead."},
		{"sluice.config.transport with ap.redis.enabled", append([]string{"--set", "ap.redis.enabled=true", "--set", "ap.redis.secretName=s", "--set", "ap.igwBaseURL=http://igw:80"},
			values(t, "sluice:\n  config:\n    transport: redis-stream\n")...),
			"sluice.config.transport selects the transport from sluice's config"},
		{"sluice.config.transport_config without transport", withSuite(values(t, "sluice:\n  config:\n    transport_config:\n      queues: []\n")...),
			"sluice.config.transport_config needs sluice.config.transport"},
		// Upstream's checks of its newer values.
		{"no transport", nil,
			"No transport configured: set ap.transport (redis-pubsub|redis-sortedset|gcp-pubsub) with ap.transportConfig, or enable a backend via ap.redis.enabled / ap.gcpPubSub.enabled (deprecated)."},
		{"ap.redis.url alone is no transport", []string{"--set", "ap.redis.url=redis://r:6379"}, "No transport configured"},
		{"transport without a document", []string{"--set", "ap.transport=redis-pubsub"},
			"ap.transport is set but ap.transportConfig is empty: provide the transport configuration document (see the README 'Transport Configuration' section)."},
		{"redis transport without a connection", values(t, "ap:\n  transport: redis-pubsub\n  transportConfig:\n    queues:\n      - queue_name: request-queue\n        igw_base_url: \"http://igw:80\"\n"),
			"redis transport has no connection: set ap.transportConfig.urlSecret.url (chart creates a Secret) or ap.transportConfig.urlSecret.name/key (reference an existing Secret), or an inline url in ap.transportConfig (dev only). The deprecated ap.redis.url / ap.redis.secretName still work. The resolved Secret is injected as REDIS_URL."},
		{"redis-stream transport without a connection", values(t, "ap:\n  transport: redis-stream\n  transportConfig:\n    queues: [{queue_name: s, igw_base_url: \"http://igw:80\"}]\n"),
			"redis transport has no connection"},
		{"the deprecated checks do not run with ap.transport", append(values(t, "ap:\n  transport: gcp-pubsub\n  transportConfig: {project_id: p, topics: [{subscriber_id: s}]}\n"),
			"--set", "ap.redis.enabled=true", "--set", "ap.gateWaitTimeout=soon"),
			"ap.gateWaitTimeout \"soon\" is not a duration"},
		// sluice's own checks of them.
		{"unknown transport", values(t, "ap:\n  transport: sql\n  transportConfig: {url: \"postgres://db\"}\n"),
			`ap.transport "sql" is not a transport sluice has`},
		{"document not a map", []string{"--set", "ap.transport=gcp-pubsub", "--set", "ap.transportConfig=x"},
			"ap.transportConfig must be a map"},
		{"urlSecret neither form", values(t, "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: {key: url}\n    queues: []\n  redis: {secretName: s}\n"),
			"ap.transportConfig.urlSecret must be {url: redis://...}"},
		{"urlSecret a string", values(t, "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: \"redis://r:6379\"\n    queues: []\n  redis: {secretName: s}\n"),
			"ap.transportConfig.urlSecret must be {url: redis://...}"},
		{"urlSecret both forms", values(t, "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: {url: \"redis://r:6379\", name: s}\n    queues: []\n"),
			"give url (the chart creates the Secret) or name (an existing Secret), not both"},
		{"gate wait timeout not a duration", withSuite("--set", "ap.gateWaitTimeout=5 minutes"), `ap.gateWaitTimeout "5 minutes" is not a duration`},
		{"gate wait timeout without a unit", withSuite("--set", "ap.gateWaitTimeout=300"), `ap.gateWaitTimeout "300" is not a duration`},
		{"negative gate wait timeout", withSuite("--set", "ap.gateWaitTimeout=-1m"), `ap.gateWaitTimeout "-1m" is not a duration`},
		{"sluice.config.transport with ap.transport", values(t, "ap:\n  transport: gcp-pubsub\n  transportConfig: {project_id: p, topics: [{subscriber_id: s}]}\nsluice:\n  config:\n    transport: redis-stream\n"),
			"sluice.config.transport selects the transport from sluice's config"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stderr := renderError(t, tc.flags...)
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("error:\n%s\nwant it to hold %q", stderr, tc.want)
			}
		})
	}
	// Redis queuesConfig does not need ap.igwBaseURL, nor gateType alone in pubsub mode.
	render(t, append([]string{"--set", "ap.redis.enabled=true", "--set", "ap.redis.secretName=s", "--set", "ap.redis.gateType=constant"},
		values(t, "ap:\n  redis:\n    queuesConfig:\n      - queue_name: q\n        igw_base_url: \"http://igw:80\"\n")...)...)
	// Durations the binary accepts pass; 0 (a number, as YAML gives it) is
	// "until the deadline" and is not replaced by the default.
	for _, d := range []string{"0", "0s", "90s", "1h30m", "250ms", "1.5h"} {
		c := deploymentOf(t, render(t, withSuite("--set", "ap.gateWaitTimeout="+d)...)).container()
		if !c.hasArg("--gate-wait-timeout=" + d) {
			t.Errorf("ap.gateWaitTimeout=%s: args %q", d, c.Args)
		}
	}
}

// Names: upstream's rules, and nameOverride=llm-d-async gives upstream's
// object names.
func TestChartNames(t *testing.T) {
	t.Parallel()
	all := values(t, "ap:\n  workerPools: [{id: default, workers: 1}]\n  redis: {url: \"redis://r:6379\"}\n  podMonitor: {enabled: true}\n  prometheusRule: {enabled: true}\n  grafana: {dashboards: {enabled: true}}\n  modelServerMonitor: {enabled: true}\n  metrics: {secure: true}\n")
	cases := []struct {
		name, release string
		flags         []string
		full, app     string
	}{
		{"default", release, nil, "release-name-sluice", "sluice"},
		{"nameOverride llm-d-async", release, []string{"--set", "nameOverride=llm-d-async"}, "release-name-llm-d-async", "llm-d-async"},
		{"fullnameOverride", release, []string{"--set", "fullnameOverride=batch-dispatcher"}, "batch-dispatcher", "sluice"},
		{"release name holding the name", "sluice-prod", nil, "sluice-prod", "sluice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := renderAs(t, tc.release, withSuite(append(slices.Clone(all), tc.flags...)...)...)
			want := []string{"Secret/" + tc.full + "-redis", "ConfigMap/" + tc.full + "-config", "ConfigMap/" + tc.full + "-dashboards",
				"Deployment/" + tc.full, "PodMonitor/" + tc.full, "PodMonitor/" + tc.full + "-modelserver", "PrometheusRule/" + tc.full, "ServiceAccount/" + tc.full}
			for _, w := range want {
				kind, name, _ := strings.Cut(w, "/")
				if objs.find(kind, name) == nil {
					t.Errorf("no %s rendered (rendered: %s)", w, objs.summary())
				}
			}
			d := deploymentOf(t, objs)
			if d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != tc.app || d.container().Name != tc.app {
				t.Errorf("name label %q, container %q, want %q", d.Spec.Selector.MatchLabels["app.kubernetes.io/name"], d.container().Name, tc.app)
			}
			if objs.find("ClusterRole", namespace+"-"+tc.full+"-metrics-auth") == nil {
				t.Errorf("no ClusterRole %s-%s-metrics-auth (rendered: %s)", namespace, tc.full, objs.summary())
			}
		})
	}
}

// The pod restarts when its config changes: a checksum of the config
// ConfigMap and of the Redis Secret is a pod annotation.
func TestChartChecksum(t *testing.T) {
	t.Parallel()
	ann := func(flags ...string) map[string]string {
		return deploymentOf(t, render(t, withSuite(flags...)...)).Spec.Template.Metadata.Annotations
	}
	base := ann("--set", "ap.workerPools[0].id=default", "--set", "ap.workerPools[0].workers=4")
	for _, k := range []string{"checksum/config", "checksum/redis-secret"} {
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(base[k]) {
			t.Errorf("annotation %s = %q, want a sha256", k, base[k])
		}
	}
	same := ann("--set", "ap.workerPools[0].id=default", "--set", "ap.workerPools[0].workers=4")
	if !reflect.DeepEqual(base, same) {
		t.Errorf("the same values give annotations %v and %v", base, same)
	}
	pools := ann("--set", "ap.workerPools[0].id=default", "--set", "ap.workerPools[0].workers=8")
	if pools["checksum/config"] == base["checksum/config"] {
		t.Errorf("checksum/config did not change with the worker pools")
	}
	cfg := ann("--set", "ap.workerPools[0].id=default", "--set", "ap.workerPools[0].workers=4", "--set", "sluice.config.request_timeout=1m")
	if cfg["checksum/config"] == base["checksum/config"] {
		t.Errorf("checksum/config did not change with sluice.config")
	}
	url := ann("--set", "ap.workerPools[0].id=default", "--set", "ap.workerPools[0].workers=4", "--set", "ap.redis.url=redis://other:6379")
	if url["checksum/redis-secret"] == base["checksum/redis-secret"] || url["checksum/config"] != base["checksum/config"] {
		t.Errorf("a new Redis URL gives %v from %v: want only checksum/redis-secret to change", url, base)
	}
	extra := ann("--set", "ap.workerPools[0].id=default", "--set", "ap.workerPools[0].workers=4", "--set", "sluice.podAnnotations.team=inference")
	if extra["team"] != "inference" || extra["checksum/config"] != base["checksum/config"] {
		t.Errorf("annotations %v: want team=inference beside the checksums", extra)
	}
}

// ServiceAccount: imagePullSecrets as upstream; sluice adds annotations,
// the GKE Workload Identity one, and using an existing account.
func TestChartServiceAccount(t *testing.T) {
	t.Parallel()
	type sa struct {
		Metadata         meta `json:"metadata"`
		ImagePullSecrets []struct {
			Name string `json:"name"`
		} `json:"imagePullSecrets"`
	}
	get := func(t *testing.T, flags ...string) (sa, objects) {
		objs := render(t, withSuite(flags...)...)
		var s sa
		decode(t, objs.one(t, "ServiceAccount"), &s)
		return s, objs
	}
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		s, _ := get(t)
		if s.Metadata.Name != "release-name-sluice" || s.Metadata.Annotations != nil || s.ImagePullSecrets != nil {
			t.Errorf("ServiceAccount %+v: want no annotations and no pull secrets", s)
		}
	})
	t.Run("image pull secrets", func(t *testing.T) {
		t.Parallel()
		s, objs := get(t, "--set-json", `ap.imagePullSecrets=[{"name":"registry-creds"},{"name":"ghcr-token"}]`, "--set", "ap.imagePullSecret=legacy")
		if len(s.ImagePullSecrets) != 2 || s.ImagePullSecrets[0].Name != "registry-creds" || s.ImagePullSecrets[1].Name != "ghcr-token" {
			t.Errorf("imagePullSecrets %+v", s.ImagePullSecrets)
		}
		if ps := deploymentOf(t, objs).Spec.Template.Spec.ImagePullSecrets; ps != nil {
			t.Errorf("pod imagePullSecrets %+v: upstream puts them on the ServiceAccount only", ps)
		}
	})
	t.Run("legacy image pull secret", func(t *testing.T) {
		t.Parallel()
		s, _ := get(t, "--set", "ap.imagePullSecret=legacy")
		if len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "legacy" {
			t.Errorf("imagePullSecrets %+v, want legacy", s.ImagePullSecrets)
		}
	})
	t.Run("workload identity", func(t *testing.T) {
		t.Parallel()
		s, _ := get(t, "--set", "sluice.serviceAccount.gcpServiceAccount=sluice@proj.iam.gserviceaccount.com", "--set", "sluice.serviceAccount.annotations.owner=batch")
		want := map[string]string{"iam.gke.io/gcp-service-account": "sluice@proj.iam.gserviceaccount.com", "owner": "batch"}
		if !reflect.DeepEqual(s.Metadata.Annotations, want) {
			t.Errorf("annotations %v, want %v", s.Metadata.Annotations, want)
		}
	})
	t.Run("existing account", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite("--set", "sluice.serviceAccount.create=false", "--set", "sluice.serviceAccount.name=shared", "--set", "ap.imagePullSecret=legacy")...)
		if n := len(objs.ofKind("ServiceAccount")); n != 0 {
			t.Errorf("%d ServiceAccounts rendered with create=false", n)
		}
		ps := deploymentOf(t, objs).Spec.Template.Spec
		if ps.ServiceAccountName != "shared" || len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "legacy" {
			t.Errorf("pod spec: serviceAccountName %q, imagePullSecrets %+v; want shared and legacy on the pod", ps.ServiceAccountName, ps.ImagePullSecrets)
		}
	})
}

// RBAC for --metrics-endpoint-auth: none unless ap.metrics.secure.
func TestChartMetricsAuthRBAC(t *testing.T) {
	t.Parallel()
	kinds := func(objs objects) int {
		return len(objs.ofKind("ClusterRole")) + len(objs.ofKind("ClusterRoleBinding"))
	}
	if n := kinds(render(t, withSuite()...)); n != 0 {
		t.Errorf("%d RBAC objects without ap.metrics.secure", n)
	}
	if n := kinds(render(t, withSuite("--set", "ap.metrics.secure=true", "--set", "sluice.rbac.create=false")...)); n != 0 {
		t.Errorf("%d RBAC objects with sluice.rbac.create=false", n)
	}
	objs := render(t, withSuite("--set", "ap.metrics.secure=true", "--set-json",
		`sluice.rbac.metricsReaderSubjects=[{"kind":"ServiceAccount","name":"prometheus-k8s","namespace":"monitoring"}]`)...)
	auth := namespace + "-release-name-sluice-metrics-auth"
	reader := namespace + "-release-name-sluice-metrics-reader"
	type rule struct {
		APIGroups       []string `json:"apiGroups"`
		Resources       []string `json:"resources"`
		NonResourceURLs []string `json:"nonResourceURLs"`
		Verbs           []string `json:"verbs"`
	}
	type role struct {
		Rules   []rule `json:"rules"`
		RoleRef struct {
			Kind, Name string
		} `json:"roleRef"`
		Subjects []map[string]string `json:"subjects"`
	}
	var r role
	decode(t, objs.find("ClusterRole", auth), &r)
	want := []rule{{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}}}
	if !reflect.DeepEqual(r.Rules, want) {
		t.Errorf("ClusterRole %s rules %+v, want %+v", auth, r.Rules, want)
	}
	var b role
	decode(t, objs.find("ClusterRoleBinding", auth), &b)
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != auth ||
		!reflect.DeepEqual(b.Subjects, []map[string]string{{"kind": "ServiceAccount", "name": "release-name-sluice", "namespace": namespace}}) {
		t.Errorf("ClusterRoleBinding %s: %+v", auth, b)
	}
	var rr role
	decode(t, objs.find("ClusterRole", reader), &rr)
	if !reflect.DeepEqual(rr.Rules, []rule{{NonResourceURLs: []string{"/metrics", "/", "/status.json"}, Verbs: []string{"get"}}}) {
		t.Errorf("ClusterRole %s rules %+v: the reader may get /metrics and the status page", reader, rr.Rules)
	}
	var rb role
	decode(t, objs.find("ClusterRoleBinding", reader), &rb)
	if rb.RoleRef.Name != reader || len(rb.Subjects) != 1 || rb.Subjects[0]["name"] != "prometheus-k8s" {
		t.Errorf("ClusterRoleBinding %s: %+v", reader, rb)
	}
	// Without the status page, the reader may get /metrics only.
	objs = render(t, withSuite("--set", "ap.metrics.secure=true", "--set", "sluice.statusPage=false")...)
	var off role
	decode(t, objs.find("ClusterRole", reader), &off)
	if !reflect.DeepEqual(off.Rules, []rule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}) {
		t.Errorf("ClusterRole %s rules %+v with the status page off", reader, off.Rules)
	}
}

// sluice's own keys.
func TestChartSluiceKeys(t *testing.T) {
	t.Parallel()
	t.Run("config, protocol, log, extra args after upstream's", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite(values(t, `sluice:
  config:
    retry: {base: 1s, max_attempts: 3}
    dispatch: {protocol: http1}
  gatewayProtocol: h2c
  statusPage: false
  log: {level: debug, format: json}
  extraArgs: ["--retry-max=30s", "--listen-host=127.0.0.1"]
`)...)...)
		c := deploymentOf(t, objs).container()
		want := append(append(transportArgs("redis-pubsub", suiteDoc), upstreamTail...),
			"--config=/etc/llm-d-async/config/sluice.json", "--gateway-protocol=h2c", "--status-page=false", "--log-level=debug", "--log-format=json", "--retry-max=30s", "--listen-host=127.0.0.1")
		wantArgs(t, c, want)
		cm := objs.find("ConfigMap", "release-name-sluice-config")
		if cm == nil || str(cm.get(`data["sluice.json"]`)) != `{"dispatch":{"protocol":"http1"},"retry":{"base":"1s","max_attempts":3}}` {
			t.Errorf("ConfigMap %v, want sluice.json", cm)
		}
		if c.mount("ap-config") == nil {
			t.Errorf("mounts %+v: want the config mounted", c.VolumeMounts)
		}
	})
	t.Run("pod settings", func(t *testing.T) {
		t.Parallel()
		d := deploymentOf(t, render(t, withSuite(values(t, `sluice:
  command: ["/llm-d-async"]
  replicas: 3
  terminationGracePeriodSeconds: 200
  podLabels: {team: inference}
  podSecurityContext: {fsGroup: 65532, seccompProfile: {type: Localhost, localhostProfile: p.json}}
  nodeSelector: {pool: batch}
  tolerations: [{key: dedicated, operator: Equal, value: batch, effect: NoSchedule}]
  topologySpreadConstraints: [{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: ScheduleAnyway}]
  priorityClassName: batch-low
  extraEnv: [{name: GOMAXPROCS, value: "2"}]
  extraEnvFrom: [{secretRef: {name: extra}}]
  extraVolumes: [{name: tmp, emptyDir: {}}]
  extraVolumeMounts: [{name: tmp, mountPath: /tmp}]
  otel: {serviceName: sluice}
ap:
  otel: {endpoint: "http://otel:4317"}
`)...)...))
		c, ps := d.container(), d.Spec.Template.Spec
		if !slices.Equal(c.Command, []string{"/llm-d-async"}) || d.Spec.Replicas != 3 || ps.TerminationGracePeriodSeconds != 200 {
			t.Errorf("command %q, replicas %d, grace %d", c.Command, d.Spec.Replicas, ps.TerminationGracePeriodSeconds)
		}
		if d.Spec.Template.Metadata.Labels["team"] != "inference" || len(d.Spec.Selector.MatchLabels) != 2 {
			t.Errorf("pod labels %v, selector %v: want team on the pod, not in the selector", d.Spec.Template.Metadata.Labels, d.Spec.Selector.MatchLabels)
		}
		wantSC := map[string]any{"runAsNonRoot": true, "fsGroup": float64(65532), "seccompProfile": map[string]any{"type": "Localhost", "localhostProfile": "p.json"}}
		if !reflect.DeepEqual(ps.SecurityContext, wantSC) {
			t.Errorf("pod securityContext %v, want %v", ps.SecurityContext, wantSC)
		}
		if ps.NodeSelector["pool"] != "batch" || len(ps.Tolerations) != 1 || len(ps.TopologySpreadConstraints) != 1 || ps.PriorityClassName != "batch-low" {
			t.Errorf("scheduling: %+v", ps)
		}
		if e := c.env("GOMAXPROCS"); e == nil || e.Value != "2" || c.Env[len(c.Env)-1].Name != "GOMAXPROCS" || len(c.EnvFrom) != 1 {
			t.Errorf("env %+v, envFrom %+v", c.Env, c.EnvFrom)
		}
		if e := c.env("OTEL_SERVICE_NAME"); e == nil || e.Value != "sluice" {
			t.Errorf("OTEL_SERVICE_NAME %+v, want sluice", e)
		}
		if m := c.mount("tmp"); m == nil || m.MountPath != "/tmp" || ps.volume("tmp") == nil || ps.volume("tmp").EmptyDir == nil {
			t.Errorf("mounts %+v, volumes %+v: want tmp", c.VolumeMounts, ps.Volumes)
		}
	})
	t.Run("transport from sluice.config", func(t *testing.T) {
		t.Parallel()
		objs := render(t, values(t, "ap:\n  redis:\n    url: \"redis://r:6379\"\nsluice:\n  config:\n    transport: redis-stream\n    transport_config:\n      queues: [{queue_name: s, igw_base_url: \"http://igw:80\"}]\n")...)
		c := deploymentOf(t, objs).container()
		wantArgs(t, c, append(slices.Clone(upstreamTail), "--config=/etc/llm-d-async/config/sluice.json"))
		if r := c.env("REDIS_URL"); r == nil || r.ValueFrom.SecretKeyRef.Name != "release-name-sluice-redis" {
			t.Errorf("REDIS_URL %+v: want it from the chart's Secret", r)
		}
		if objs.find("Secret", "release-name-sluice-redis") == nil {
			t.Errorf("no Redis Secret rendered")
		}
	})
	t.Run("no REDIS_URL without a redis transport", func(t *testing.T) {
		t.Parallel()
		// (This used to render with no transport at all, which now fails.)
		objs := render(t, append(slices.Clone(minimal), "--set", "ap.redis.url=redis://r:6379")...)
		if c := deploymentOf(t, objs).container(); c.env("REDIS_URL") != nil || len(objs.ofKind("Secret")) != 0 {
			t.Errorf("REDIS_URL or a Secret on gcp-pubsub (upstream renders neither)")
		}
	})
}

// Upstream's newer values (UPSTREAM-v0.10.md §6): ap.transport with its
// document, urlSecret in both forms, the deprecated connection values on
// the new surface, ap.env, ap.gateWaitTimeout, and NOTES.txt's warnings.
func TestChartTransport(t *testing.T) {
	t.Parallel()
	const queues = "    queues:\n      - queue_name: q\n        igw_base_url: \"http://igw:80\"\n"
	const qDoc = `"queues":[{"igw_base_url":"http://igw:80","queue_name":"q"}]`
	cases := []struct {
		name, values string
		flags        []string
		transport    string
		doc          string
		redisURL     string // REDIS_URL's <secret>/<key>, "" for none
		secretURL    string // stringData.url of <fullname>-redis, "" for no Secret
	}{
		{"urlSecret url: the chart creates the Secret", "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: {url: \"redis://created:6379\"}\n    result_queue_name: results\n" + queues,
			nil, "redis-sortedset", `{` + qDoc + `,"result_queue_name":"results"}`, "release-name-sluice-redis/url", "redis://created:6379"},
		{"urlSecret name and key: an existing Secret", "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: {name: my-existing, key: conn}\n" + queues,
			nil, "redis-sortedset", `{` + qDoc + `}`, "my-existing/conn", ""},
		{"urlSecret name: key defaults to url", "ap:\n  transport: redis-pubsub\n  transportConfig:\n    urlSecret: {name: my-existing}\n" + queues,
			nil, "redis-pubsub", `{` + qDoc + `}`, "my-existing/url", ""},
		{"inline url: in the document, no Secret", "ap:\n  transport: redis-sortedset\n  transportConfig:\n    url: \"redis://inline:6379\"\n" + queues,
			nil, "redis-sortedset", `{` + qDoc + `,"url":"redis://inline:6379"}`, "", ""},
		{"deprecated ap.redis.url still gives the Secret", "ap:\n  transport: redis-sortedset\n  redis: {url: \"redis://legacy:6379\"}\n  transportConfig:\n" + queues,
			nil, "redis-sortedset", `{` + qDoc + `}`, "release-name-sluice-redis/url", "redis://legacy:6379"},
		{"deprecated ap.redis.secretName still gives REDIS_URL", "ap:\n  transport: redis-sortedset\n  redis: {secretName: redis-creds, secretKey: conn}\n  transportConfig:\n" + queues,
			nil, "redis-sortedset", `{` + qDoc + `}`, "redis-creds/conn", ""},
		{"urlSecret wins over ap.redis.*", "ap:\n  transport: redis-sortedset\n  redis: {url: \"redis://legacy:6379\", secretName: s}\n  transportConfig:\n    urlSecret: {name: new-secret}\n" + queues,
			nil, "redis-sortedset", `{` + qDoc + `}`, "new-secret/url", ""},
		{"ap.transport wins over the deprecated selectors", "ap:\n  transport: gcp-pubsub\n  messageQueueImpl: redis-sortedset\n  redis: {enabled: true, secretName: s}\n  transportConfig: {project_id: p, result_topic_id: r, topics: [{subscriber_id: s, igw_base_url: \"http://igw:80\"}]}\n",
			nil, "gcp-pubsub", `{"project_id":"p","result_topic_id":"r","topics":[{"igw_base_url":"http://igw:80","subscriber_id":"s"}]}`, "", ""},
		{"no Redis Secret for gcp-pubsub", "ap:\n  transport: gcp-pubsub\n  transportConfig:\n    urlSecret: {url: \"redis://created:6379\"}\n    project_id: my-project\n    result_topic_id: results\n    topics: []\n",
			nil, "gcp-pubsub", `{"project_id":"my-project","result_topic_id":"results","topics":[]}`, "", ""},
		{"redis-stream on the new values", "ap:\n  transport: redis-stream\n  transportConfig:\n    urlSecret: {name: s}\n" + queues,
			nil, "redis-stream", `{` + qDoc + `}`, "s/url", ""},
		{"the document keeps numbers, lists and escapes", "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: {name: s}\n    batch_size: 32\n    claim_lease_ttl_seconds: 300\n    queues:\n      - {queue_name: q, igw_base_url: \"http://igw:80\", gate_params: {limit: 40}, labels: {tier: batch}, note: \"a<b & c>d\"}\n",
			nil, "redis-sortedset", `{"batch_size":32,"claim_lease_ttl_seconds":300,"queues":[{"gate_params":{"limit":40},"igw_base_url":"http://igw:80","labels":{"tier":"batch"},"note":"a\u003cb \u0026 c\u003ed","queue_name":"q"}]}`, "s/url", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, append(values(t, tc.values), tc.flags...)...)
			c := deploymentOf(t, objs).container()
			wantArgs(t, c, append(transportArgs(tc.transport, tc.doc), upstreamTail...))
			if got := secretRef(c, "REDIS_URL"); got != tc.redisURL {
				t.Errorf("REDIS_URL from %q, want %q", got, tc.redisURL)
			}
			s := objs.find("Secret", "release-name-sluice-redis")
			switch {
			case tc.secretURL == "" && len(objs.ofKind("Secret")) != 0:
				t.Errorf("Secrets rendered: %s, want none", objs.summary())
			case tc.secretURL != "" && (s == nil || str(s.get("stringData.url")) != tc.secretURL || s.get("type") != "Opaque"):
				t.Errorf("Secret %v, want release-name-sluice-redis with url %s", s, tc.secretURL)
			}
		})
	}

	t.Run("env, affinity and gate wait timeout", func(t *testing.T) {
		t.Parallel()
		d := deploymentOf(t, render(t, values(t, `ap:
  transport: redis-sortedset
  transportConfig:
    urlSecret: {name: s}
`+queues+`  gateWaitTimeout: 0
  otel: {endpoint: "http://otel:4317"}
  env: [{name: PUBSUB_EMULATOR_HOST, value: "emulator:8085"}, {name: GOMAXPROCS, value: "2"}]
  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {topologyKey: zone}}]}}
sluice:
  extraEnv: [{name: EXTRA, value: "1"}]
`)...))
		c := d.container()
		var names []string
		for _, e := range c.Env {
			names = append(names, e.Name)
		}
		// The chart's own, then ap.env (after REDIS_URL, as upstream), then
		// sluice.extraEnv.
		want := []string{"LOG_LEVEL", "POD_NAME", "NAMESPACE", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_INSECURE", "OTEL_TRACES_SAMPLER",
			"OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "REDIS_URL", "PUBSUB_EMULATOR_HOST", "GOMAXPROCS", "EXTRA"}
		if !slices.Equal(names, want) {
			t.Errorf("env %q, want %q", names, want)
		}
		if e := c.env("PUBSUB_EMULATOR_HOST"); e == nil || e.Value != "emulator:8085" {
			t.Errorf("PUBSUB_EMULATOR_HOST %+v", e)
		}
		if !c.hasArg("--gate-wait-timeout=0") || slices.Index(c.Args, "--gate-wait-timeout=0") != slices.Index(c.Args, "--concurrency=64")+1 {
			t.Errorf("args %q: want --gate-wait-timeout=0 right after --concurrency", c.Args)
		}
		if d.Spec.Template.Spec.Affinity["podAntiAffinity"] == nil {
			t.Errorf("affinity %v", d.Spec.Template.Spec.Affinity)
		}
	})

	t.Run("the transport flags come first, sluice's after upstream's", func(t *testing.T) {
		t.Parallel()
		c := deploymentOf(t, render(t, values(t, `ap:
  transport: redis-sortedset
  prometheusURL: "http://prom:9090"
  workerPools: [{id: default, workers: 2}]
  requestMergePolicyConfig: {type: random-robin}
  transportConfig:
    urlSecret: {name: s}
`+queues+`sluice:
  log: {level: debug}
`)...)).container()
		want := append(transportArgs("redis-sortedset", `{`+qDoc+`}`), "--prometheus-url=http://prom:9090",
			"--pool-config-file=/etc/llm-d-async/config/worker-pools.json", "--request-merge-policy-config-file=/etc/llm-d-async/config/request-merge-policy.json")
		wantArgs(t, c, append(append(want, upstreamTail...), "--log-level=debug"))
	})

	notes := func(t *testing.T, flags ...string) string {
		t.Helper()
		return renderNotes(t, flags...)
	}
	t.Run("notes", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name     string
			flags    []string
			want     []string
			dontWant []string
		}{
			{"deprecated values", withSuite("--set", "ap.messageQueueImpl=redis-sortedset"),
				[]string{"Transport: redis-sortedset", "WARNING: deprecated chart values in use.", "transport: redis-sortedset",
					`{"batch_size":10,"poll_interval_ms":1000,"queues":[{"igw_base_url":"http://igw:80","queue_name":"request-sortedset","request_path_url":"/v1/completions"}],"result_queue_name":"result-list"}`,
					"WARNING: deprecated Redis connection values in use."},
				// As upstream's, the connection warning comes with ap.redis.secretName
				// on the deprecated values too.
				[]string{"redis-pubsub is deprecated"}},
			{"deprecated pubsub", withSuite(), []string{"WARNING: deprecated chart values in use.", "WARNING: redis-pubsub is deprecated upstream"}, nil},
			{"new values with the deprecated connection", values(t, "ap:\n  transport: redis-sortedset\n  redis: {secretName: redis-creds}\n  transportConfig:\n"+queues),
				[]string{"Transport: redis-sortedset", "WARNING: deprecated Redis connection values in use."}, []string{"deprecated chart values"}},
			{"new values", values(t, "ap:\n  transport: redis-sortedset\n  transportConfig:\n    urlSecret: {name: s}\n"+queues),
				[]string{"Transport: redis-sortedset"}, []string{"WARNING"}},
			{"sluice.config transport", values(t, "ap:\n  redis: {secretName: s}\nsluice:\n  config:\n    transport: redis-stream\n    transport_config: {queues: []}\n"),
				[]string{"Transport: redis-stream (sluice.config.transport)"}, []string{"WARNING"}},
		} {
			n := notes(t, tc.flags...)
			if tc.name == "deprecated values" && strings.Contains(n, "{{") {
				t.Errorf("NOTES not rendered:\n%s", n)
			}
			for _, w := range tc.want {
				if !strings.Contains(n, w) {
					t.Errorf("%s: NOTES lack %q:\n%s", tc.name, w, n)
				}
			}
			for _, w := range tc.dontWant {
				if strings.Contains(n, w) {
					t.Errorf("%s: NOTES hold %q:\n%s", tc.name, w, n)
				}
			}
		}
	})
}

// renderNotes renders templates/NOTES.txt with flags. helm template leaves
// NOTES.txt out and helm install needs a cluster even with --dry-run, so
// it renders a copy of the chart holding one more template: a ConfigMap
// whose data is NOTES.txt (kept at the copy's root, where .Files reads it)
// passed through tpl with the release's values.
func renderNotes(t *testing.T, flags ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-notes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	chart := filepath.Join(dir, "sluice")
	if err := os.CopyFS(chart, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chart, "notes-under-test.txt"), notes, 0o600); err != nil {
		t.Fatal(err)
	}
	tmpl := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-under-test\ndata:\n  notes: {{ tpl (.Files.Get \"notes-under-test.txt\") . | quote }}\n"
	if err := os.WriteFile(filepath.Join(chart, "templates", "notes-under-test.yaml"), []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"template", release, chart, "--namespace", namespace, "--show-only", "templates/notes-under-test.yaml"}, flags...)
	out, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm template (NOTES): %v\n%s", err, stderr)
	}
	cm := parseObjects(t, out).one(t, "ConfigMap")
	return str(cm.get("data.notes"))
}

// The upstream-style values files of ci/ (the newer transport values and
// the deprecated ones) render exactly these arguments, REDIS_URL source and
// Secret; TestCIValuesStartSluice starts sluice with what they render.
func TestChartUpstreamValuesFiles(t *testing.T) {
	t.Parallel()
	const gw = "http://envoy.e2e-integration.svc.cluster.local:8081"
	const redis = "redis://redis.e2e-integration.svc.cluster.local:6379"
	cases := []struct {
		file, transport, doc string
		middle               []string // arguments between the document and the common tail
		gateWait             string
		redisURL, secretURL  string
		env                  []string
	}{
		{"transport-redis-sortedset-url", "redis-sortedset",
			`{"batch_size":32,"poll_interval_ms":200,"queues":[{"igw_base_url":"` + gw + `","inference_objective":"interactive","queue_name":"transport-interactive-request-sortedset","request_path_url":"/v1/completions"},{"gate_params":{"budget":"0.5"},"gate_type":"constant","igw_base_url":"` + gw + `","queue_name":"transport-batch-request-sortedset","result_queue_name":"transport-batch-result-list"}],"result_queue_name":"transport-result-list"}`,
			nil, "2m", "release-name-sluice-redis/url", redis, []string{"LOG_LEVEL", "REDIS_URL", "GODEBUG"}},
		{"transport-redis-sortedset-secret", "redis-sortedset",
			`{"queues":[{"gate_params":{"pool":"e2e-pool","threshold":"0.7"},"gate_type":"prometheus-saturation","igw_base_url":"` + gw + `","queue_name":"saturation-request-sortedset"}],"result_queue_name":"saturation-result-list"}`,
			[]string{"--prometheus-url=http://prometheus.e2e-integration.svc.cluster.local:9090", "--prometheus-cache-ttl=0s"}, "5m", "redis-creds/connection", "", []string{"LOG_LEVEL", "REDIS_URL"}},
		{"transport-gcp-pubsub", "gcp-pubsub",
			`{"project_id":"e2e-project","result_topic_id":"llm-d-async-results","topics":[{"gate_params":{"budget":"1"},"gate_type":"constant","igw_base_url":"` + gw + `","request_path_url":"/v1/completions","subscriber_id":"transport-requests-pool-a"},{"igw_base_url":"` + gw + `","inference_objective":"batch","subscriber_id":"transport-requests-pool-b"}]}`,
			[]string{"--pool-config-file=/etc/llm-d-async/config/worker-pools.json"}, "5m", "", "", []string{"LOG_LEVEL"}},
		{"transport-redis-pubsub-inline-url", "redis-pubsub",
			`{"queues":[{"igw_base_url":"` + gw + `","queue_name":"pubsub-dev-requests"}],"result_queue_name":"pubsub-dev-results","url":"` + redis + `"}`,
			nil, "0", "", "", []string{"LOG_LEVEL"}},
		{"redis-sortedset-single", "redis-sortedset",
			`{"batch_size":10,"poll_interval_ms":100,"queues":[{"gate_params":{"fallback":"0.0","query":"1 - inference_extension_flow_control_pool_saturation{inference_pool=\"e2e-pool\"}"},"gate_type":"prometheus-query","igw_base_url":"` + gw + `","queue_name":"prometheus-query-request-sortedset","request_path_url":"/v1/completions"}],"result_queue_name":"prometheus-query-result-list"}`,
			[]string{"--prometheus-url=http://prometheus.e2e-integration.svc.cluster.local:9090", "--prometheus-cache-ttl=0s"}, "5m", "release-name-sluice-redis/url", redis, []string{"LOG_LEVEL", "REDIS_URL"}},
		{"redis-pubsub", "redis-pubsub",
			`{"queues":[{"igw_base_url":"` + gw + `","queue_name":"request-queue","request_path_url":"/v1/chat/completions"}]}`,
			nil, "5m", "redis-creds/url", "", []string{"LOG_LEVEL", "REDIS_URL"}},
		{"gcp-pubsub-single", "gcp-pubsub",
			`{"project_id":"e2e-project","result_topic_id":"llm-d-async-results","topics":[{"igw_base_url":"` + gw + `","request_path_url":"/v1/chat/completions","subscriber_id":"llm-d-async-requests"}]}`,
			nil, "5m", "", "", []string{"LOG_LEVEL"}},
		{"gcp-pubsub-gated", "gcp-pubsub",
			`{"project_id":"e2e-project","result_topic_id":"llm-d-async-results","topics":[{"gate_params":{"pool":"e2e-pool","threshold":0.7},"gate_type":"prometheus-saturation","igw_base_url":"` + gw + `","subscriber_id":"saturation-requests","worker_pool_id":"batch"},{"igw_base_url":"` + gw + `","subscriber_id":"interactive-requests"}]}`,
			[]string{"--prometheus-url=http://prometheus.e2e-integration.svc.cluster.local:9090", "--prometheus-cache-ttl=0s", "--pool-config-file=/etc/llm-d-async/config/worker-pools.json"},
			"5m", "", "", []string{"LOG_LEVEL"}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			objs := render(t, "-f", filepath.Join(chartDir, "ci", tc.file+".yaml"))
			c := deploymentOf(t, objs).container()
			tail := slices.Clone(upstreamTail)
			tail[1] = "--gate-wait-timeout=" + tc.gateWait
			wantArgs(t, c, append(append(transportArgs(tc.transport, tc.doc), tc.middle...), tail...))
			if got := secretRef(c, "REDIS_URL"); got != tc.redisURL {
				t.Errorf("REDIS_URL from %q, want %q", got, tc.redisURL)
			}
			var names []string
			for _, e := range c.Env {
				names = append(names, e.Name)
			}
			if !slices.Equal(names, tc.env) {
				t.Errorf("env %q, want %q", names, tc.env)
			}
			secrets := objs.ofKind("Secret")
			switch {
			case tc.secretURL == "" && len(secrets) != 0:
				t.Errorf("Secrets %s, want none", objs.summary())
			case tc.secretURL != "" && (len(secrets) != 1 || str(secrets[0].get("stringData.url")) != tc.secretURL):
				t.Errorf("Secrets %v, want release-name-sluice-redis with url %s", secrets, tc.secretURL)
			}
		})
	}
}
