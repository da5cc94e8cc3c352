package redisclient

import (
	"strings"
	"testing"
)

func TestSlot(t *testing.T) {
	// Reference values from CLUSTER KEYSLOT on redis-server 7.
	for key, want := range map[string]int{
		"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443,
		"foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061, "": 0,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestTagged(t *testing.T) {
	for _, key := range []string{"llm-d-async:requests:pool", "q{a", "{x}rest", "a{b}c"} {
		p, err := Tagged(key)
		if err != nil {
			t.Fatalf("Tagged(%q): %v", key, err)
		}
		if Slot(p+":leases") != Slot(key) {
			t.Errorf("Tagged(%q)+\":leases\" = %q is in slot %d, key in %d", key, p, Slot(p+":leases"), Slot(key))
		}
	}
	if _, err := Tagged("a{}b"); err == nil || !strings.Contains(err.Error(), "hash tag") {
		t.Errorf("Tagged(a{}b) = %v, want an error about hash tags", err)
	}
}

func TestParse(t *testing.T) {
	o, err := Parse("redis://u:p@127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", Cluster)
	if err != nil {
		t.Fatal(err)
	}
	if o.Cluster == nil || len(o.Cluster.Addrs) != 3 || o.Cluster.Password != "p" || o.Cluster.ClusterStateReloadInterval != ClusterStateReload {
		t.Fatalf("cluster options = %+v", o.Cluster)
	}
	o.Tune(func(c *Common) { c.PoolSize = 7; c.MaxRetries = -1 })
	if o.Cluster.PoolSize != 7 || o.Cluster.MaxRetries != -1 {
		t.Errorf("Tune did not reach the cluster options: %+v", o.Cluster)
	}
	if _, err := Parse("redis://127.0.0.1:7000?addr=127.0.0.1:7001", Single); err == nil || !strings.Contains(err.Error(), "cluster") {
		t.Errorf("a cluster URL in single mode: %v, want a hint to set cluster mode", err)
	}
	s, err := Parse("redis://127.0.0.1:6379/3", "")
	if err != nil || s.Single == nil || s.DB() != 3 || s.Mode() != Single {
		t.Errorf("single: %+v %v", s, err)
	}
	for in, want := range map[string]Mode{"": Single, "standalone": Single, "Cluster": Cluster} {
		if m, err := ParseMode(in); err != nil || m != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, m, err)
		}
	}
	if m, err := ParseMode("sentinel"); err != nil || m != Sentinel {
		t.Errorf("ParseMode(sentinel) = %q, %v", m, err)
	}
	if _, err := ParseMode("replicated"); err == nil || !strings.Contains(err.Error(), "sentinel") {
		t.Errorf("ParseMode(replicated) = %v, want an error naming the modes", err)
	}
}

func TestSentinel(t *testing.T) {
	top := Topology{Mode: Sentinel, Addrs: []string{"10.0.0.2:26379", "10.0.0.1:26379"}, MasterName: "mymaster"}
	o, err := top.Parse("rediss://app:secret@10.0.0.1:26379/2?addr=10.0.0.3:26379&master_name=mymaster&pool_size=9")
	if err != nil {
		t.Fatal(err)
	}
	f := o.Failover
	if f == nil || o.Mode() != Sentinel || o.DB() != 2 {
		t.Fatalf("options = %+v", o)
	}
	if want := []string{"10.0.0.1:26379", "10.0.0.3:26379", "10.0.0.2:26379"}; strings.Join(f.SentinelAddrs, ",") != strings.Join(want, ",") {
		t.Errorf("sentinel addrs = %v, want %v (the URL's host, its addr=, then addrs, once each)", f.SentinelAddrs, want)
	}
	// As upstream: the URL's credentials are the master's, the sentinels
	// are asked without AUTH.
	if f.MasterName != "mymaster" || f.Username != "app" || f.Password != "secret" || f.SentinelPassword != "" || f.TLSConfig == nil || f.PoolSize != 9 {
		t.Errorf("failover options = %+v", f)
	}
	o.Tune(func(c *Common) { c.MaxRetries = -1; c.PoolSize = 3 })
	if f.MaxRetries != -1 || f.PoolSize != 3 {
		t.Errorf("Tune did not reach the failover options: %+v", f)
	}
	if w := o.Where(); w != "sentinel master mymaster via 10.0.0.1:26379,10.0.0.3:26379,10.0.0.2:26379/2" {
		t.Errorf("Where = %q", w)
	}
	a, err := Topology{Mode: Sentinel, MasterName: "m"}.FromAddr("s1:26379", "", "pw", 1)
	if err != nil || a.Failover == nil || a.Failover.SentinelAddrs[0] != "s1:26379" || a.Failover.Password != "pw" || a.DB() != 1 {
		t.Errorf("FromAddr sentinel = %+v, %v", a, err)
	}

	for name, c := range map[string]struct {
		top  Topology
		url  string
		want string
	}{
		"no master_name":       {Topology{Mode: Sentinel}, "redis://s:26379", "needs master_name"},
		"master_name single":   {Topology{MasterName: "m"}, "redis://h:6379", "needs mode sentinel"},
		"master_name cluster":  {Topology{Mode: Cluster, MasterName: "m"}, "redis://h:6379", "needs mode sentinel"},
		"addrs single":         {Topology{Addrs: []string{"h2:6379"}}, "redis://h:6379", "need mode cluster or sentinel"},
		"bad addr":             {Topology{Mode: Sentinel, MasterName: "m", Addrs: []string{"nohost"}}, "redis://s:26379", "not host:port"},
		"url disagrees":        {Topology{Mode: Sentinel, MasterName: "m"}, "redis://s:26379?master_name=other", "disagrees"},
		"bad url addr":         {Topology{Mode: Sentinel, MasterName: "m"}, "redis://s:26379?addr=x", "not host:port"},
		"sentinel url, single": {Topology{}, "redis://s:26379?master_name=m", "set the redis mode to sentinel"},
		"no url":               {Topology{Mode: Sentinel, MasterName: "m"}, "", "no Redis URL"},
	} {
		if _, err := c.top.Parse(c.url); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Parse(%q) = %v, want an error containing %q", name, c.url, err, c.want)
		}
	}

	co, err := Topology{Mode: Cluster, Addrs: []string{"n2:7000"}}.Parse("redis://n1:7000?addr=n3:7000")
	if err != nil || strings.Join(co.Cluster.Addrs, ",") != "n1:7000,n3:7000,n2:7000" {
		t.Errorf("cluster with addrs = %+v, %v", co, err)
	}
	// A mode written as configuration may write it (upstream's
	// "standalone", any case) is read, not taken for single.
	if co, err := (Topology{Mode: "Cluster"}).Parse("redis://n1:7000"); err != nil || co.Mode() != Cluster {
		t.Errorf(`Topology{Mode: "Cluster"}.Parse = %+v, %v; want cluster options`, co, err)
	}
	if _, err := (Topology{Mode: "replicated"}).Parse("redis://n1:7000"); err == nil || !strings.Contains(err.Error(), `redis mode "replicated"`) {
		t.Errorf("unknown mode: %v", err)
	}
	if got := (Topology{}).Or(top); got.MasterName != "mymaster" {
		t.Errorf("empty topology Or deployment's = %+v", got)
	}
	if got := (Topology{Mode: Single}).Or(top); got.Mode != Single || got.MasterName != "" {
		t.Errorf("own topology Or deployment's = %+v, want its own", got)
	}
	if _, err := ParseTopology("standalone", nil, ""); err != nil {
		t.Errorf("ParseTopology(standalone): %v", err)
	}
	if _, err := ParseTopology("sentinel", []string{"a:1"}, ""); err == nil {
		t.Error("ParseTopology(sentinel, no master name) accepted")
	}
}
