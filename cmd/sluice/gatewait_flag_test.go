package main

import (
	"strings"
	"testing"
)

// TestUpstreamGateWaitTimeout: --gate-wait-timeout, which upstream's chart
// renders on every start since #426, is accepted (0 and durations), a
// negative value is refused naming the flag, and setting it says at start
// that this build does not apply it.
func TestUpstreamGateWaitTimeout(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://redis:6379/0")
	base := []string{"--metrics-endpoint-auth=false", "--transport=redis-sortedset", "--transport-config", `{"queues":[{"queue_name":"q","igw_base_url":"http://gw:80"}]}`}
	for _, tc := range []struct {
		value, wantErr string
	}{
		{"5m", ""},
		{"0", ""},
		{"90s", ""},
		{"-1s", "--gate-wait-timeout: -1s is negative"},
		{"soon", `invalid argument "soon" for "--gate-wait-timeout"`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			_, warn, err := loadUpstream(t, append(append([]string{}, base...), "--gate-wait-timeout="+tc.value)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one holding %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(warn, "\n"), "--gate-wait-timeout") {
				t.Errorf("warnings %q: want one naming --gate-wait-timeout", warn)
			}
		})
	}
	if _, warn, err := loadUpstream(t, base...); err != nil || strings.Contains(strings.Join(warn, "\n"), "gate-wait-timeout") {
		t.Errorf("without the flag: err %v, warnings %q", err, warn)
	}
}
