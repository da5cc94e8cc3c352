// Package names parses the comma-separated lists by which the harness
// programs (tools/bench, tools/chaos) select what they run.
package names

import (
	"slices"
	"strings"
)

// Set is the names of a comma-separated list, blanks trimmed and empty
// entries dropped; an empty list is an empty set.
func Set(list string) map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}

// Unknown returns the names of want that known does not hold, sorted.
func Unknown(want map[string]bool, known []string) []string {
	var out []string
	for n := range want {
		if !slices.Contains(known, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
