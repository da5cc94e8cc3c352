package config

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
)

// mergePolicyParams are the merge-policy parameters sluice reads.
func mergePolicyParams() []string {
	return []string{"fairness_attribute", "fairness_header", "priority_header", "tier_label",
		"objective_header", "lane_objectives", "lane_min_share"}
}

// mergePolicyParamPolicy is the policy a merge-policy parameter applies to
// ("" for both).
func mergePolicyParamPolicy(k string) string {
	switch k {
	case "priority_header", "tier_label", "objective_header", "lane_objectives", "lane_min_share":
		return PolicyTierPriority
	}
	return ""
}

// Warnings are the settings of c that upstream accepts too and that act on
// nothing here, one line each: sluice loads them, so that upstream's files
// keep working, and says once, at start, that they are ignored (app.New
// logs the lines; app.CheckWarnings returns them, and sluice validate
// prints them). Everything else c holds either acts or
// is refused by Validate.
func (c *Config) Warnings() []string {
	var out []string
	if c.TransportConfig.EnableTracing {
		out = append(out, "transport_config.enable_tracing is accepted and ignored: sluice makes no per-command Redis spans; "+
			"requests are traced with tracing.otlp_endpoint (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(c.MergePolicy.Parameters, &params) == nil {
		keys := make([]string, 0, len(params))
		for k := range params {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		known := mergePolicyParams()
		policy := c.MergePolicy.Type
		if policy == "" {
			policy = PolicyRandomRobin
		}
		for _, k := range keys {
			only, ok := mergePolicyParamPolicy(k), slices.Contains(known, k)
			switch {
			case !ok:
				hint := ""
				if s := nearest(k, known); s != "" {
					hint = fmt.Sprintf(" (did you mean %q?)", s)
				}
				out = append(out, fmt.Sprintf("merge_policy.parameters.%s is not a parameter sluice reads%s: ignored, as upstream ignores it", k, hint))
			case only != "" && only != policy:
				out = append(out, fmt.Sprintf("merge_policy.parameters.%s applies to the %s policy only: ignored with %s", k, only, policy))
			}
		}
	}
	return out
}

// nearest returns the name in names closest to k when it is a likely
// misspelling (at most two edits, or a third of k), else "".
func nearest(k string, names []string) string {
	best, bestD := "", 1<<30
	for _, n := range names {
		if d := editDistance(k, n); d < bestD {
			best, bestD = n, d
		}
	}
	if bestD <= max(2, len(k)/3) && !slices.Contains(names, k) {
		return best
	}
	return ""
}
