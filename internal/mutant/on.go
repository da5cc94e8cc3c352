//go:build sluice_mutants

package mutant

import (
	"os"
	"path/filepath"
	"sync"
)

// HitsEnvVar names the directory in which a mutant build marks each planted bug that was
// reached (an empty file named after it), so the runner can tell a bug the tests caught from
// one they never exercised.
const HitsEnvVar = "SLUICE_MUTANT_HITS"

// planted is read once: the runner starts one test process per mutant.
var (
	planted  = Name(os.Getenv(EnvVar))
	hitsDir  = os.Getenv(HitsEnvVar)
	markOnce sync.Once
)

// On reports whether the named bug is planted: SLUICE_MUTANT names it.
func On(n Name) bool {
	if planted == "" || n != planted {
		return false
	}
	markOnce.Do(func() {
		if hitsDir != "" {
			_ = os.WriteFile(filepath.Join(hitsDir, string(n)), nil, 0o644)
		}
	})
	return true
}

// Enabled reports whether this build can plant bugs at all (the sluice_mutants tag).
const Enabled = true
