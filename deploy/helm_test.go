package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"
)

// helmVersion is the helm the chart is checked with.
const helmVersion = "v3.22.0"

// chartDir is the chart, relative to this package.
const chartDir = "helm/sluice"

// release and namespace are the release the tests render.
const (
	release   = "release-name"
	namespace = "sluice-test"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm returns the path of the helm binary: $SLUICE_HELM when set, else
// helm helmVersion, built once with `go install
// helm.sh/helm/v3/cmd/helm@<helmVersion>` into
// <user cache dir>/sluice-test/helm-<helmVersion>/helm and reused from
// there (deploy/monitoring shares it). Built into a private directory and
// renamed into place, so a parallel run sees no helm or a whole one.
func helm(t testing.TB) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = findHelm() })
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

func findHelm() (string, error) {
	if p := os.Getenv("SLUICE_HELM"); p != "" {
		return p, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "sluice-test", "helm-"+helmVersion)
	bin := filepath.Join(dir, "helm")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	cmd.Dir = tmp // outside this module: helm's own module graph
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install helm.sh/helm/v3/cmd/helm@%s (or set SLUICE_HELM to a helm binary): %v\n%s", helmVersion, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// runHelm runs helm with args in a private home, and returns its stdout
// and stderr.
func runHelm(t testing.TB, args ...string) (string, string, error) {
	t.Helper()
	bin := helm(t)
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// templateArgs are the arguments of `helm template` of release name with
// flags (-f, --set, --set-json, ...).
func templateArgs(name string, flags ...string) []string {
	return append([]string{"template", name, chartDir, "--namespace", namespace}, flags...)
}

// render runs `helm template` with flags (--set ..., -f ...) and returns
// the objects it renders; a failed render fails t.
func render(t testing.TB, flags ...string) objects {
	t.Helper()
	return renderAs(t, release, flags...)
}

// renderAs is render with the release name name.
func renderAs(t testing.TB, name string, flags ...string) objects {
	t.Helper()
	out, stderr, err := runHelm(t, templateArgs(name, flags...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(flags, " "), err, stderr)
	}
	return parseObjects(t, out)
}

// renderError runs `helm template` with flags, which must fail, and
// returns its error output.
func renderError(t testing.TB, flags ...string) string {
	t.Helper()
	out, stderr, err := runHelm(t, templateArgs(release, flags...)...)
	if err == nil {
		t.Fatalf("helm template %s succeeded, want an error; it rendered:\n%s", strings.Join(flags, " "), out)
	}
	return stderr
}

// object is one rendered Kubernetes object, as decoded from YAML.
type object map[string]any

// objects are the objects of one render, in order.
type objects []object

// parseObjects decodes every YAML document of a render.
func parseObjects(t testing.TB, s string) objects {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(s))
	var objs objects
	for {
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, s)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs
}

func (o object) kind() string { s, _ := o["kind"].(string); return s }

func (o object) name() string { return str(o.get("metadata.name")) }

// get returns the value at path: keys separated by ".", a list index as
// [n], a key holding dots as ["a.b"].
func (o object) get(path string) any {
	var cur any = map[string]any(o)
	for _, seg := range splitPath(path) {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[seg]
		case []any:
			var i int
			if _, err := fmt.Sscanf(seg, "%d", &i); err != nil || i < 0 || i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	return cur
}

// splitPath splits a.b[0]["c.d"] into a, b, 0, c.d.
func splitPath(path string) []string {
	var segs []string
	for path != "" {
		switch {
		case strings.HasPrefix(path, `["`):
			end := strings.Index(path, `"]`)
			segs = append(segs, path[2:end])
			path = path[end+2:]
		case path[0] == '[':
			end := strings.IndexByte(path, ']')
			segs = append(segs, path[1:end])
			path = path[end+1:]
		case path[0] == '.':
			path = path[1:]
		default:
			end := strings.IndexAny(path, ".[")
			if end < 0 {
				end = len(path)
			}
			segs = append(segs, path[:end])
			path = path[end:]
		}
	}
	return segs
}

// find returns the object of kind and name, or nil.
func (objs objects) find(kind, name string) object {
	for _, o := range objs {
		if o.kind() == kind && o.name() == name {
			return o
		}
	}
	return nil
}

// ofKind returns the objects of kind.
func (objs objects) ofKind(kind string) objects {
	var out objects
	for _, o := range objs {
		if o.kind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of kind, failing t unless there is exactly one.
func (objs objects) one(t testing.TB, kind string) object {
	t.Helper()
	of := objs.ofKind(kind)
	if len(of) != 1 {
		t.Fatalf("%d objects of kind %s rendered, want 1 (rendered: %s)", len(of), kind, objs.summary())
	}
	return of[0]
}

func (objs objects) summary() string {
	var parts []string
	for _, o := range objs {
		parts = append(parts, o.kind()+"/"+o.name())
	}
	return strings.Join(parts, ", ")
}

// decode converts v (decoded YAML) into out through JSON.
func decode(t testing.TB, v any, out any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

func str(v any) string {
	if v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// The parts of a Deployment the tests read.
type (
	deployment struct {
		Metadata meta `json:"metadata"`
		Spec     struct {
			Replicas int `json:"replicas"`
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Template struct {
				Metadata meta    `json:"metadata"`
				Spec     podSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	meta struct {
		Name        string            `json:"name"`
		Namespace   *string           `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	}
	podSpec struct {
		SecurityContext               map[string]any   `json:"securityContext"`
		Containers                    []container      `json:"containers"`
		ServiceAccountName            string           `json:"serviceAccountName"`
		TerminationGracePeriodSeconds int              `json:"terminationGracePeriodSeconds"`
		Volumes                       []volume         `json:"volumes"`
		Affinity                      map[string]any   `json:"affinity"`
		NodeSelector                  map[string]any   `json:"nodeSelector"`
		Tolerations                   []map[string]any `json:"tolerations"`
		TopologySpreadConstraints     []map[string]any `json:"topologySpreadConstraints"`
		PriorityClassName             string           `json:"priorityClassName"`
		ImagePullSecrets              []struct {
			Name string `json:"name"`
		} `json:"imagePullSecrets"`
	}
	container struct {
		Name            string           `json:"name"`
		Image           string           `json:"image"`
		ImagePullPolicy string           `json:"imagePullPolicy"`
		Command         []string         `json:"command"`
		Args            []string         `json:"args"`
		Env             []envVar         `json:"env"`
		EnvFrom         []map[string]any `json:"envFrom"`
		Ports           []struct {
			Name          string `json:"name"`
			ContainerPort int    `json:"containerPort"`
			Protocol      string `json:"protocol"`
		} `json:"ports"`
		StartupProbe    probe          `json:"startupProbe"`
		LivenessProbe   probe          `json:"livenessProbe"`
		ReadinessProbe  probe          `json:"readinessProbe"`
		SecurityContext map[string]any `json:"securityContext"`
		Resources       map[string]any `json:"resources"`
		VolumeMounts    []volumeMount  `json:"volumeMounts"`
	}
	envVar struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"secretKeyRef"`
			FieldRef *struct {
				FieldPath string `json:"fieldPath"`
			} `json:"fieldRef"`
		} `json:"valueFrom"`
	}
	probe struct {
		HTTPGet struct {
			Path string `json:"path"`
			Port string `json:"port"`
		} `json:"httpGet"`
		InitialDelaySeconds int `json:"initialDelaySeconds"`
		PeriodSeconds       int `json:"periodSeconds"`
		TimeoutSeconds      int `json:"timeoutSeconds"`
		FailureThreshold    int `json:"failureThreshold"`
	}
	volume struct {
		Name      string `json:"name"`
		ConfigMap *struct {
			Name string `json:"name"`
		} `json:"configMap"`
		Secret *struct {
			SecretName string `json:"secretName"`
		} `json:"secret"`
		EmptyDir map[string]any `json:"emptyDir"`
	}
	volumeMount struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
		ReadOnly  bool   `json:"readOnly"`
	}
)

// deploymentOf returns the one Deployment of objs.
func deploymentOf(t testing.TB, objs objects) deployment {
	t.Helper()
	var d deployment
	decode(t, objs.one(t, "Deployment"), &d)
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(d.Spec.Template.Spec.Containers))
	}
	return d
}

// container returns the Deployment's only container.
func (d deployment) container() container { return d.Spec.Template.Spec.Containers[0] }

// env returns the container's variable name, or nil.
func (c container) env(name string) *envVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// hasArg reports whether the container's args hold arg.
func (c container) hasArg(arg string) bool {
	for _, a := range c.Args {
		if a == arg {
			return true
		}
	}
	return false
}

// argAfter returns the argument following flag ("" when absent).
func (c container) argAfter(flag string) string {
	for i, a := range c.Args {
		if a == flag && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
	}
	return ""
}

// argValue returns v of an argument flag=v, and whether one is there.
func (c container) argValue(flag string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func (c container) mount(name string) *volumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func (p podSpec) volume(name string) *volume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// chartMeta is Chart.yaml.
type chartMeta struct {
	Name       string `yaml:"name"`
	Version    string `yaml:"version"`
	AppVersion string `yaml:"appVersion"`
}

func readChart(t testing.TB) chartMeta {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c chartMeta
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// ciFiles are the values files of helm/sluice/ci.
func ciFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci: %v", chartDir, err)
	}
	return files
}
