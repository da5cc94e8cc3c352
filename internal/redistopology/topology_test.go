package redistopology

import (
	"reflect"
	"testing"
)

// Check reads the mode case-insensitively, applies upstream's rules and
// names every problem with the keys it is given.
func TestCheck(t *testing.T) {
	deployment := Keys{Mode: "redis_mode", Addrs: "redis_addrs", MasterName: "redis_master_name"}
	for _, tc := range []struct {
		k            Keys
		mode, master string
		addrs        []string
		wantMode     Mode
		want         []string
	}{
		{Options, "", "", nil, Single, nil},
		{Options, " Standalone ", "", nil, Single, nil},
		{Options, "Cluster", "", []string{"n:1"}, Cluster, nil},
		{Options, "sentinel", " m ", []string{"s:1", "s:2"}, Sentinel, nil},
		{Options, "replicated", "m", []string{"x"}, "", []string{`mode: "replicated": want single (or standalone), cluster or sentinel`}},
		{Options, "sentinel", "  ", nil, Sentinel, []string{"mode: sentinel needs master_name (the name the sentinels monitor the master under)"}},
		{deployment, "sentinel", "", nil, Sentinel, []string{"redis_mode: sentinel needs redis_master_name (the name the sentinels monitor the master under)"}},
		{deployment, "cluster", "m", nil, Cluster, []string{`redis_master_name: "m" needs redis_mode sentinel (the mode is cluster)`}},
		{Options, "", "m", []string{"h:1", "nohost"}, Single, []string{`master_name: "m" needs mode sentinel (the mode is single)`,
			"addrs: [h:1 nohost] need mode cluster or sentinel (the mode is single)", `addrs: "nohost" is not host:port`}},
	} {
		m, ps := Check(tc.k, tc.mode, tc.addrs, tc.master)
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		if m != tc.wantMode || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Check(%q, %v, %q) = %q, %q; want %q, %q", tc.mode, tc.addrs, tc.master, m, got, tc.wantMode, tc.want)
		}
	}
}
