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
	if _, err := ParseMode("sentinel"); err == nil {
		t.Error("ParseMode(sentinel) accepted")
	}
}
