//go:build !sluice_mutants

package redisquota

import "github.com/sluice-io/sluice/internal/mutant"

// mutatedScript returns nil: planted-bug scripts exist only in a build with
// the sluice_mutants tag (internal/mutant).
func mutatedScript(mutant.Name) *script { return nil }
