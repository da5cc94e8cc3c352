//go:build !sluice_mutants

package mutant

// HitsEnvVar names the directory in which a mutant build marks each planted bug that was
// reached (see the sluice_mutants build).
const HitsEnvVar = "SLUICE_MUTANT_HITS"

// On reports whether the named bug is planted. Without the sluice_mutants build tag it is the
// constant false: the compiler inlines it and drops the guarded branch.
func On(Name) bool { return false }

// Enabled reports whether this build can plant bugs at all (the sluice_mutants tag).
const Enabled = false
