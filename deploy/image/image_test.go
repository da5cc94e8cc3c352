package image

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The --build-arg values the tests build with.
const (
	testVersion = "v0.0.0-imagetest"
	testCommit  = "c0ffee1"
)

// The binary's path in the image as upstream's Helm chart runs it (its
// container command), besides the ENTRYPOINT.
const upstreamCommand = "/llm-d-async"

func buildArgs() map[string]string {
	return map[string]string{
		"VERSION":    testVersion,
		"COMMIT":     testCommit,
		"TARGETOS":   runtime.GOOS,
		"TARGETARCH": runtime.GOARCH,
	}
}

// repoRoot is the module's root: the Dockerfile's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

func readPlanT(t *testing.T) (*plan, string) {
	t.Helper()
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df, err := parseDockerfile(string(text))
	if err != nil {
		t.Fatal(err)
	}
	p, err := readPlan(df, buildArgs())
	if err != nil {
		t.Fatal(err)
	}
	return p, root
}

// goMod returns go.mod's module path and go version.
func goMod(t *testing.T, root string) (module, goVersion string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "module" {
			module = f[1]
		}
		if len(f) == 2 && f[0] == "go" {
			goVersion = f[1]
		}
	}
	if module == "" || goVersion == "" {
		t.Fatalf("go.mod: module %q, go %q", module, goVersion)
	}
	return module, goVersion
}

// versionParts splits "1.26.8" into [1 26 8] (missing parts are 0).
func versionParts(t *testing.T, v string) [3]int {
	t.Helper()
	var out [3]int
	for i, s := range strings.SplitN(v, ".", 3) {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("version %q: %v", v, err)
		}
		out[i] = n
	}
	return out
}

// TestDockerfile checks the Dockerfile's shape without building: the build
// stage (Go version, module layer, build flags) and the final stage (base,
// user, entrypoint, labels).
func TestDockerfile(t *testing.T) {
	p, root := readPlanT(t)
	module, goVersion := goMod(t, root)

	t.Run("build stage Go matches go.mod", func(t *testing.T) {
		m := regexp.MustCompile(`^golang:(\d+\.\d+(?:\.\d+)?)(?:-[a-z0-9]+)?(?:@sha256:[0-9a-f]+)?$`).FindStringSubmatch(p.build.base)
		if m == nil {
			t.Fatalf("%s: base %q, want the official golang image (golang:<version>)", p.build.from, p.build.base)
		}
		img, mod := versionParts(t, m[1]), versionParts(t, goVersion)
		if img[0] != mod[0] || img[1] != mod[1] {
			t.Errorf("%s: Go %s, go.mod says go %s: use the same major.minor", p.build.from, m[1], goVersion)
		}
		if slices.Compare(img[:], mod[:]) < 0 {
			t.Errorf("%s: Go %s is older than go.mod's go %s: the golang image sets GOTOOLCHAIN=local and would not build the module", p.build.from, m[1], goVersion)
		}
		if local := strings.TrimPrefix(runtime.Version(), "go"); !strings.HasPrefix(local, fmt.Sprintf("%d.%d", img[0], img[1])) {
			t.Logf("note: these tests build with the local %s; the image builds with Go %s", runtime.Version(), m[1])
		}
	})

	t.Run("module download is its own layer", func(t *testing.T) {
		if p.modCopy < 0 || p.modDownload < 0 {
			t.Fatalf("build stage: want COPY go.mod go.sum ./ and RUN go mod download before the sources are copied (modCopy %d, modDownload %d)", p.modCopy, p.modDownload)
		}
		if !(p.modCopy < p.modDownload && p.modDownload < p.contextCopy) {
			t.Errorf("build stage: want COPY go.mod go.sum (#%d) < RUN go mod download (#%d) < COPY . (#%d)", p.modCopy, p.modDownload, p.contextCopy)
		}
	})

	t.Run("go build flags", func(t *testing.T) {
		if p.goBuildCount != 1 || p.goBuild == nil {
			t.Fatalf("build stage: %d go build commands, want 1", p.goBuildCount)
		}
		env := map[string]string{}
		for k, v := range p.goBuild.env {
			env[k] = v
		}
		for _, e := range p.goBuild.cmd.env {
			k, v, _ := strings.Cut(e, "=")
			env[k] = v
		}
		if env["CGO_ENABLED"] != "0" {
			t.Errorf("%s: CGO_ENABLED=%q, want 0 (a static binary for a distroless/scratch image)", p.goBuild.from, env["CGO_ENABLED"])
		}
		if env["GOOS"] != runtime.GOOS || env["GOARCH"] != runtime.GOARCH {
			t.Errorf("%s: GOOS=%q GOARCH=%q, want the target platform (%s/%s from TARGETOS/TARGETARCH)", p.goBuild.from, env["GOOS"], env["GOARCH"], runtime.GOOS, runtime.GOARCH)
		}
		argv := p.goBuild.cmd.argv
		if !slices.Contains(argv, "-trimpath") {
			t.Errorf("%s: no -trimpath", p.goBuild.from)
		}
		ld := ldflags(argv)
		for _, want := range []string{"-s", "-w"} {
			if !slices.Contains(strings.Fields(ld), want) {
				t.Errorf("%s: -ldflags %q: no %s", p.goBuild.from, ld, want)
			}
		}
		if !strings.Contains(ld, "-X main.version="+testVersion) {
			t.Errorf("%s: -ldflags %q: want -X main.version=$VERSION", p.goBuild.from, ld)
		}
		if argv[len(argv)-1] != "./cmd/sluice" {
			t.Errorf("%s: builds %q, want ./cmd/sluice", p.goBuild.from, argv[len(argv)-1])
		}
	})

	t.Run("final stage", func(t *testing.T) {
		base := p.final.base
		if !(strings.HasPrefix(base, "gcr.io/distroless/static") && strings.Contains(base, ":nonroot")) && base != "scratch" {
			t.Errorf("%s: base %q, want gcr.io/distroless/static*:nonroot (CA certificates, passwd, no shell), or scratch", p.final.from, base)
		}
		if !slices.Equal(p.entrypoint, []string{"/sluice"}) {
			t.Errorf("ENTRYPOINT %q, want [\"/sluice\"] (exec form)", p.entrypoint)
		}
		if p.cmd != nil {
			t.Errorf("CMD %q: the charts pass every argument; a CMD would be appended when they pass none", p.cmd)
		}
		uid, gid, hasGID := strings.Cut(p.user, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("USER %q: want a numeric, non-root uid (the kubelet checks runAsNonRoot only on numeric ones)", p.user)
		} else if n != 65532 {
			t.Errorf("USER %q: want 65532, distroless's nonroot and upstream's", p.user)
		}
		if n, err := strconv.Atoi(gid); hasGID && (err != nil || n == 0) {
			t.Errorf("USER %q: want a numeric, non-root gid", p.user)
		}
	})

	t.Run("labels", func(t *testing.T) {
		want := map[string]string{
			"org.opencontainers.image.source":  "https://" + module,
			"org.opencontainers.image.version": testVersion,
		}
		if _, err := os.Stat(filepath.Join(root, "LICENSE")); err == nil {
			want["org.opencontainers.image.licenses"] = "" // any value
		}
		for k, v := range want {
			got, ok := p.labels[k]
			if !ok {
				t.Errorf("no LABEL %s", k)
			} else if v != "" && got != v {
				t.Errorf("LABEL %s=%q, want %q", k, got, v)
			}
		}
	})

	t.Run("dockerignore keeps what the build reads", func(t *testing.T) {
		rules := readDockerignore(t, root)
		for _, must := range []string{".git", "sluice", "redisquota.test"} {
			if !ignored(rules, must) {
				t.Errorf(".dockerignore: %s is sent with the context", must)
			}
		}
		cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}{{end}}`, "./cmd/sluice")
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			dir, _ := filepath.Rel(root, f[0])
			for _, name := range append([]string{"go.mod", "go.sum"}, f[1:]...) {
				rel := filepath.ToSlash(filepath.Join(dir, name))
				if name == "go.mod" || name == "go.sum" {
					rel = name
				}
				if ignored(rules, rel) {
					t.Errorf(".dockerignore leaves out %s, which go build ./cmd/sluice reads", rel)
				}
			}
		}
	})
}

func readDockerignore(t *testing.T, root string) []ignoreRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatalf("%v (without it the whole repository, .git and built binaries included, is the build context)", err)
	}
	rules, err := parseDockerignore(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// ldflags returns the value of go build's -ldflags.
func ldflags(argv []string) string {
	for i, a := range argv {
		if a == "-ldflags" && i+1 < len(argv) {
			return argv[i+1]
		}
		if v, ok := strings.CutPrefix(a, "-ldflags="); ok {
			return v
		}
	}
	return ""
}

// TestImageBinary builds the binary as the Dockerfile does, from the
// context .dockerignore leaves, lays out the image's files, and checks and
// runs the ENTRYPOINT and upstream's command.
func TestImageBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice: not in -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image is a Linux one; the ELF checks need a Linux build")
	}
	p, root := readPlanT(t)
	module, _ := goMod(t, root)

	tmp := t.TempDir()
	ctx, stageRoot, rootfs := filepath.Join(tmp, "context"), filepath.Join(tmp, "build"), filepath.Join(tmp, "rootfs")
	if err := copyContext(root, ctx, readDockerignore(t, root)); err != nil {
		t.Fatalf("copy the build context: %v", err)
	}
	start := time.Now()
	if err := p.execute(ctx, stageRoot, rootfs, t.Logf); err != nil {
		t.Fatal(err)
	}
	t.Logf("built and laid out in %s", time.Since(start).Round(time.Second))

	entry, err := resolveIn(rootfs, p.entrypoint[0])
	if err != nil {
		t.Fatalf("ENTRYPOINT %s: %v", p.entrypoint[0], err)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, p.entrypoint[0])); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o001 == 0 {
		t.Fatalf("ENTRYPOINT %s: want a regular file executable by any user (the image runs as %s): %v %v", p.entrypoint[0], p.user, fi.Mode(), err)
	}

	t.Run("upstream's command is the same binary", func(t *testing.T) {
		alias, err := resolveIn(rootfs, upstreamCommand)
		if err != nil {
			t.Fatalf("%s (upstream's chart runs it): %v", upstreamCommand, err)
		}
		a, err1 := os.Stat(alias)
		e, err2 := os.Stat(entry)
		if err1 != nil || err2 != nil || !os.SameFile(a, e) {
			t.Errorf("%s resolves to %s, not the ENTRYPOINT's %s", upstreamCommand, alias, entry)
		}
	})

	t.Run("static and stripped", func(t *testing.T) {
		f, err := elf.Open(entry)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
				t.Errorf("program header %s: the binary is dynamically linked", prog.Type)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("DT_NEEDED %q (%v): the binary needs shared libraries", libs, err)
		}
		if f.Section(".dynamic") != nil || f.Section(".interp") != nil {
			t.Error("the binary has a .dynamic or .interp section")
		}
		for _, s := range f.Sections {
			if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
				t.Errorf("section %s: the binary is not stripped (-s -w)", s.Name)
			}
		}
	})

	t.Run("build settings", func(t *testing.T) {
		bi, err := buildinfo.ReadFile(entry)
		if err != nil {
			t.Fatal(err)
		}
		if bi.Path != module+"/cmd/sluice" {
			t.Errorf("main package %q", bi.Path)
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
			t.Errorf("CGO_ENABLED=%q -trimpath=%q, want 0 and true", settings["CGO_ENABLED"], settings["-trimpath"])
		}
		if settings["GOOS"] != runtime.GOOS || settings["GOARCH"] != runtime.GOARCH {
			t.Errorf("GOOS=%q GOARCH=%q", settings["GOOS"], settings["GOARCH"])
		}
		data, err := os.ReadFile(entry)
		if err != nil {
			t.Fatal(err)
		}
		for _, local := range []string{ctx, root} {
			if bytes.Contains(data, []byte(local)) {
				t.Errorf("the binary holds the local path %s: -trimpath did not apply", local)
			}
		}
	})

	t.Run("version", func(t *testing.T) {
		out := run(t, entry, p.entrypoint[0], "version")
		want := "sluice " + testVersion
		if strings.Contains(ldflags(p.goBuild.cmd.argv), "-X main.commit="+testCommit) {
			want += " (" + testCommit + ")"
		}
		if strings.TrimSpace(out) != want {
			t.Errorf("version: %q, want %q", strings.TrimSpace(out), want)
		}
		if got := p.labels["org.opencontainers.image.version"]; !strings.Contains(strings.TrimSpace(out), got) {
			t.Errorf("version %q does not show the image's version label %q", out, got)
		}
	})

	t.Run("help", func(t *testing.T) {
		out := run(t, entry, p.entrypoint[0], "--help")
		for _, want := range []string{"serve", "demo", "version"} {
			if !strings.Contains(out, want) {
				t.Errorf("--help does not list %q:\n%s", want, out)
			}
		}
	})

	t.Run("demo", func(t *testing.T) {
		out := run(t, entry, p.entrypoint[0], "demo", "--mode", "mechanics", "--requests", "30", "--json")
		var sum struct {
			Requests   int `json:"requests"`
			Results    int `json:"results"`
			Missing    int `json:"missing"`
			Duplicates int `json:"duplicates"`
		}
		i := strings.Index(out, "{")
		if i < 0 {
			t.Fatalf("demo --json printed no JSON:\n%s", out)
		}
		if err := json.Unmarshal([]byte(out[i:]), &sum); err != nil {
			t.Fatalf("demo --json: %v\n%s", err, out)
		}
		if sum.Requests != 30 || sum.Results != 30 || sum.Missing != 0 || sum.Duplicates != 0 {
			t.Errorf("demo: %+v, want 30 requests, 30 results, none missing or duplicated", sum)
		}
	})

	t.Run("upstream's command serves with upstream's flags", func(t *testing.T) {
		// As upstream's chart runs it: /llm-d-async <flags>, no subcommand.
		// The memory transport stands in for Redis; the tail of flags is the
		// chart's.
		alias := filepath.Join(rootfs, upstreamCommand)
		ports := freePorts(t, 2)
		health, metrics := ports[0], ports[1]
		cmd := exec.Command(alias,
			"--transport=memory",
			`--transport-config={"result_queue_name":"results","queues":[{"queue_name":"requests","igw_base_url":"http://127.0.0.1:1"}]}`,
			"--concurrency=64", "--drain-timeout=2m",
			"--health-port="+strconv.Itoa(health), "--metrics-endpoint-auth=false", "--metrics-port="+strconv.Itoa(metrics))
		cmd.Args[0] = upstreamCommand
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var waitErr error
		exited := make(chan struct{})
		go func() { waitErr = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			select {
			case <-exited:
			default:
				cmd.Process.Kill()
				<-exited
			}
		})
		base := fmt.Sprintf("http://127.0.0.1:%d", health)
		deadline := time.Now().Add(60 * time.Second)
		for {
			if code, _ := get(base + "/healthz"); code == http.StatusOK {
				break
			}
			select {
			case <-exited:
				t.Fatalf("%s exited before serving: %v\n%s", upstreamCommand, waitErr, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("/healthz not OK within 60s\n%s", out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if code, body := get(base + "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz: %d %s", code, body)
		}
		if code, body := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)); code != http.StatusOK || !strings.Contains(body, "llm_d_async_async_") {
			t.Errorf("/metrics: %d, upstream's metrics present: %v", code, strings.Contains(body, "llm_d_async_async_"))
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
			if waitErr != nil {
				t.Errorf("after SIGTERM: %v\n%s", waitErr, out.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("still running 30s after SIGTERM\n%s", out.String())
		}
		if !strings.Contains(out.String(), "version="+testVersion) {
			t.Errorf("the start-up log does not name version %s:\n%s", testVersion, out.String())
		}
	})
}

// run runs the binary at local as the image would run argv0 and returns its
// output; a non-zero exit fails the test.
func run(t *testing.T, local, argv0 string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, local, args...)
	cmd.Args[0] = argv0
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", argv0, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// freePorts returns n distinct free TCP ports (all held open until every
// one is chosen, so that no two are the same).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func get(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
