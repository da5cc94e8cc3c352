// Package mutant plants deliberate protocol bugs for the mutation test (tools/mutants,
// docs/verification.md). A call site sits at the exact protocol step it breaks:
//
//	if mutant.On(mutant.SettleNoFence) {
//		// the buggy path
//	}
//
// In a normal build On is a constant false, inlined and removed with the branch it guards, so
// the product carries neither the cost nor the bug. Built with `-tags sluice_mutants`, On reports
// whether the environment variable SLUICE_MUTANT names the mutant (one name; empty plants none).
// The runner builds the model tests with the tag once per mutant, sets the variable, and expects
// the tests to fail.
package mutant

// EnvVar names the environment variable that selects the planted mutant in a build with the
// sluice_mutants tag.
const EnvVar = "SLUICE_MUTANT"

// Tag is the build tag that makes On read EnvVar.
const Tag = "sluice_mutants"

// Name is the name of one planted bug.
type Name string

// Mutant is one planted bug and the tests that must catch it.
type Mutant struct {
	// Name selects the bug (SLUICE_MUTANT=<Name>).
	Name Name
	// Doc says in one line what the bug does.
	Doc string
	// Packages are the `go test` package patterns whose tests must fail with the bug planted.
	Packages []string
	// Run is the -run pattern that selects those tests (empty runs every test of Packages).
	Run string
	// Args are extra arguments for the test binary (for example -rapid.checks=200).
	Args []string
}

// Catalog lists every planted bug in the order the runner tries them. Each protocol keeps its
// own list in its own file (redis.go, ...); Catalog joins them.
func Catalog() []Mutant {
	var all []Mutant
	all = append(all, redisCatalog...)
	all = append(all, flowCatalog...)
	return all
}
