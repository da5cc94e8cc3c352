//go:build sluice_mutants

package keys

import (
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/mutant"
)

// Mutated returns the planted-bug variant of a script for mutant n (see
// internal/mutant and docs/verification.md), or nil when n has none. Each
// variant is the real script with one edit; an edit that no longer applies
// (the script changed) panics, so a mutant never silently becomes the real
// script.
func Mutated(n mutant.Name) *redis.Script {
	switch n {
	case mutant.SettleNoFence:
		return redis.NewScript(edit(settleSrc, "if tok ~= '' and owners[j] == tok and not seen[ck] then", "if tok ~= '' and not seen[ck] then"))
	case mutant.AckBeforeResult:
		// The first of two calls: the claims are dropped, the results not written.
		return redis.NewScript(edit(settleSrc, "  redis.call('LPUSH', KEYS[4], unpack(results))\n", ""))
	case mutant.HeartbeatNoRenew:
		return redis.NewScript(edit(extendSrc, "if #zi > 0 then redis.call('ZADD', KEYS[2], unpack(zi)) end\n", ""))
	case mutant.TakeoverIgnoresLive:
		return redis.NewScript(edit(reclaimSrc, "if exp and tonumber(exp) <= now then", "if exp then"))
	}
	return nil
}

func edit(src, old, repl string) string {
	if !strings.Contains(src, old) {
		panic("mutant edit no longer applies: " + old)
	}
	return strings.Replace(src, old, repl, 1)
}
