package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The binary must not link the testing package at all. Two dependencies
// would bring it in when raised: hashicorp/go-plugin from v1.6.2 on (a
// testing.go in its main package imports it; sluice holds it at v1.6.0,
// see plugins/host/lograte.go's crashRelay), and prometheus/common from
// v0.73 on (it pulls in pandatix/go-abnf, whose fuzz helpers import it):
// raising either makes this test fail, naming the path.

// forbiddenInBinary are the test rigs of this module, by import path
// fragment: none may be linked into the binary.
var forbiddenInBinary = []string{
	"/gates/gatetest",
	"/transports/transporttest",
	"/internal/testenv",
	"/internal/rigs/",
	"/sluice/tools/",
}

// heavyInBinary are libraries the binary must not link, by import path
// prefix, with what to use instead: each cost megabytes of a release
// build that bench's binary scenario holds to 40 MiB (issue 43).
var heavyInBinary = map[string]string{
	"github.com/openai/openai-go": "cmd/sluice/batchclient.go's plain HTTP (about 20 MB)",
	"cloud.google.com/go/storage": "front/filestore/gcs's JSON API client (about 18 MB with gRPC xDS)",
	"github.com/aws/":             "front/filestore/s3's SigV4 client (about 8 MB)",
	"google.golang.org/grpc/xds":  "nothing: only cloud.google.com/go/storage pulled it in",
	"github.com/envoyproxy/":      "nothing: only gRPC xDS pulled it in",
}

// The sluice binary links none of heavyInBinary: each path through which
// it would is printed.
func TestBinaryLinksNoHeavyClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	n := 0
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		n++
		for _, imp := range f[1:] {
			for heavy, instead := range heavyInBinary {
				if strings.HasPrefix(imp, heavy) && !strings.HasPrefix(f[0], heavy) {
					t.Errorf("%s imports %s; use %s", f[0], imp, instead)
				}
			}
		}
	}
	if n < 50 {
		t.Fatalf("go list -deps listed %d packages: not the binary's graph", n)
	}
}

// The sluice binary links no test rig and not the testing package: every
// path through which it would is printed.
func TestBinaryLinksNoTestRig(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	importers := map[string][]string{} // package → the deps that import it
	var deps []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		deps = append(deps, f[0])
		for _, imp := range f[1:] {
			importers[imp] = append(importers[imp], f[0])
		}
	}
	if len(deps) < 50 || !slices.Contains(deps, "github.com/sluice-io/sluice/cmd/sluice") {
		t.Fatalf("go list -deps listed %d packages without cmd/sluice: not the binary's graph", len(deps))
	}
	for _, p := range deps {
		for _, bad := range forbiddenInBinary {
			if strings.Contains(p, bad) {
				t.Errorf("the binary links the test rig %s, imported by %v", p, importers[p])
			}
		}
	}
	for _, imp := range importers["testing"] {
		t.Errorf("the binary links testing through %s (imported by %v)", imp, importers[imp])
	}
	if slices.Contains(deps, "testing") && len(importers["testing"]) == 0 {
		t.Error("the binary links testing, imported by no package go list names")
	}
}

// The fronts talk to the dispatcher only through queues: the sync front
// and the disk file store take their shared config types from
// internal/configtypes, so they do not link core/config (and with it the
// router, the HTTP client and the gate machinery).
func TestFrontsLinkNoCoreConfig(t *testing.T) {
	for _, pkg := range []string{"../../front/openai", "../../front/filestore/disk"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed %d packages", pkg, len(deps))
		}
		for _, bad := range []string{"github.com/sluice-io/sluice/core/config", "github.com/sluice-io/sluice/core/pipeline", "github.com/sluice-io/sluice/core/dispatch"} {
			if slices.Contains(deps, bad) {
				t.Errorf("%s links %s", pkg, bad)
			}
		}
	}
}
