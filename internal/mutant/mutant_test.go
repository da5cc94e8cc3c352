package mutant_test

import (
	"testing"

	"github.com/sluice-io/sluice/internal/mutant"
)

// TestOffInNormalBuilds checks that a build without the sluice_mutants tag plants nothing, even
// with SLUICE_MUTANT set: the product can never carry a planted bug.
func TestOffInNormalBuilds(t *testing.T) {
	if mutant.Enabled {
		t.Skip("built with the sluice_mutants tag: the runner's build")
	}
	t.Setenv(mutant.EnvVar, string(mutant.SettleNoFence))
	for _, m := range mutant.Catalog() {
		if mutant.On(m.Name) {
			t.Fatalf("mutant %s is on in a build without the %s tag", m.Name, mutant.Tag)
		}
	}
}

// TestCatalog checks the catalog: names unique, each with a doc line and tests to run.
func TestCatalog(t *testing.T) {
	seen := map[mutant.Name]bool{}
	for _, m := range mutant.Catalog() {
		if m.Name == "" || m.Doc == "" || len(m.Packages) == 0 {
			t.Errorf("incomplete catalog entry %+v", m)
		}
		if seen[m.Name] {
			t.Errorf("mutant %s listed twice", m.Name)
		}
		seen[m.Name] = true
	}
	if len(seen) == 0 {
		t.Fatal("empty catalog")
	}

}
