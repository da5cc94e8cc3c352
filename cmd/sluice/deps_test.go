package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// testingImporters are the packages allowed to bring `testing` into the
// sluice binary: hashicorp/go-plugin (the plugin host's launcher) has a
// testing.go in its main package that imports it, from v1.6 on; nothing of
// ours may. prometheus/common is held at v0.72.x for the same reason (its
// v0.73 pulls in pandatix/go-abnf, whose fuzz helpers import testing):
// raising it makes this test fail, naming that path.
var testingImporters = []string{"github.com/hashicorp/go-plugin"}

// forbiddenInBinary are the test rigs of this module, by import path
// fragment: none may be linked into the binary.
var forbiddenInBinary = []string{
	"/gates/gatetest",
	"/transports/transporttest",
	"/internal/testenv",
	"/internal/rigs/",
	"/sluice/tools/",
}

// The sluice binary links no test rig and, but for the importers listed
// above, not the testing package: every path through which it would is
// printed.
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
		if !slices.Contains(testingImporters, imp) {
			t.Errorf("the binary links testing through %s (imported by %v)", imp, importers[imp])
		}
	}
}
