package redisconn

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestOptionsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"bad address", Config{Address: "nohost"}, "want host:port"},
		{"url and password", Config{Address: "redis://h:1/0", Password: "x"}, "go in the address URL"},
		{"cert without tls", Config{Address: "h:1", TLSCert: "c", TLSKey: "k"}, "need tls=true or a rediss:// address"},
		{"cert without key", Config{Address: "rediss://h:1/0", TLSCert: "c"}, "tls_cert and tls_key go together"},
		{"missing cert file", Config{Address: "h:1", TLS: true, TLSCert: "/nonexistent.pem", TLSKey: "/nonexistent.key"}, "tls_cert/tls_key"},
		{"unknown mode", Config{Address: "h:1", Mode: "replicated"}, `redis mode "replicated": want single (or standalone), cluster or sentinel`},
		{"sentinel without master name", Config{Address: "h:1", Mode: redisclient.Sentinel}, "needs master_name"},
		{"master name in single mode", Config{Address: "h:1", MasterName: "m"}, "needs mode sentinel"},
		{"addrs in single mode", Config{Address: "h:1", Addrs: []string{"h:2"}}, "need mode cluster or sentinel"},
		{"sentinel url disagrees", Config{Address: "redis://h:1?master_name=a", Mode: redisclient.Sentinel, MasterName: "b"}, "disagrees"},
		{"db with cluster", Config{Address: "h:1", Mode: redisclient.Cluster, DB: 2}, "db must be 0 with a Redis Cluster"},
		{"db in a cluster url", Config{Address: "redis://h:1/3?addr=h:2", Mode: redisclient.Cluster}, "a Redis Cluster has only db 0"},
		{"cluster url in single mode", Config{Address: "redis://h:1?addr=h:2"}, "set the redis mode to cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.c.Options(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Options: %v, want %q", err, tc.want)
			}
		})
	}
}

// Both modes get the settings every gate relies on; a cluster address is
// one seed node or go-redis' cluster URL.
func TestOptionsModes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		c     Config
		mode  redisclient.Mode
		addrs []string
		where string
	}{
		{"single host:port", Config{Address: "h:1", DB: 2}, redisclient.Single, []string{"h:1"}, "h:1/2"},
		{"single url", Config{Address: "redis://:pw@h:1/0"}, redisclient.Single, []string{"h:1"}, "h:1"},
		{"cluster seed", Config{Address: "h:1", Mode: redisclient.Cluster, Password: "pw", TLS: true},
			redisclient.Cluster, []string{"h:1"}, "cluster h:1"},
		{"cluster url", Config{Address: "redis://:pw@h:1?addr=h:2&addr=h:3", Mode: redisclient.Cluster},
			redisclient.Cluster, []string{"h:1", "h:2", "h:3"}, "cluster h:1,h:2,h:3"},
		{"cluster url with db 0", Config{Address: "rediss://h:1/0", Mode: redisclient.Cluster},
			redisclient.Cluster, []string{"h:1"}, "cluster h:1"},
		{"sentinel host:port", Config{Address: "s:1", Mode: redisclient.Sentinel, MasterName: "m", Addrs: []string{"s:2"}, DB: 1, TLS: true},
			redisclient.Sentinel, []string{"s:1", "s:2"}, "sentinel master m via s:1,s:2/1"},
		{"sentinel url", Config{Address: "redis://:pw@s:1/0?addr=s:3", Mode: redisclient.Sentinel, MasterName: "m", Addrs: []string{"s:2"}},
			redisclient.Sentinel, []string{"s:1", "s:3", "s:2"}, "sentinel master m via s:1,s:3,s:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.c.Options()
			if err != nil {
				t.Fatal(err)
			}
			if o.Mode() != tc.mode || Where(o) != tc.where {
				t.Errorf("mode %s, where %q; want %s, %q", o.Mode(), Where(o), tc.mode, tc.where)
			}
			var got []string
			o.Tune(func(c *redisclient.Common) {
				// A failover client has no maintenance notifications at all.
				noMaint := o.Failover != nil || c.MaintNotifications != nil && c.MaintNotifications.Mode == maintnotifications.ModeDisabled
				if c.MaxRetries != -1 || c.DialTimeout != 2*time.Second || !c.ContextTimeoutEnabled || !c.DisableIdentity || !noMaint {
					t.Errorf("common settings %+v", c)
				}
				if host := strings.SplitN(tc.c.Address, ":", 2)[0]; tc.c.TLS && (c.TLSConfig == nil || c.TLSConfig.ServerName != host) {
					t.Errorf("tls config %+v, want server name %s", c.TLSConfig, host)
				}
			})
			switch {
			case o.Failover != nil:
				got = o.Failover.SentinelAddrs
				if o.Failover.MasterName != tc.c.MasterName {
					t.Errorf("master name %q", o.Failover.MasterName)
				}
			case o.Cluster != nil:
				got = o.Cluster.Addrs
				if o.Cluster.ClusterStateReloadInterval != redisclient.ClusterStateReload {
					t.Errorf("cluster state reload %v", o.Cluster.ClusterStateReloadInterval)
				}
			default:
				got = []string{o.Single.Addr}
			}
			if !slices.Equal(got, tc.addrs) {
				t.Errorf("addrs %v, want %v", got, tc.addrs)
			}
		})
	}
}

// A gate's connection reaches a redis-server that listens only on TLS and
// requires a client certificate: with tls_ca_cert, tls_cert and tls_key,
// and not without the certificate.
func TestTLSClientCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := testenv.StartRedisTLS(t)
	for _, tc := range []struct {
		name string
		c    Config
		ok   bool
	}{
		{"rediss url with client cert", Config{Address: srv.URL, TLSCACert: srv.CAFile, TLSCert: srv.CertFile, TLSKey: srv.KeyFile}, true},
		{"host:port with tls and client cert", Config{Address: srv.Addr, TLS: true, TLSCACert: srv.CAFile, TLSCert: srv.CertFile, TLSKey: srv.KeyFile}, true},
		{"no client cert", Config{Address: srv.URL, TLSCACert: srv.CAFile}, false},
		{"untrusted server", Config{Address: srv.URL, TLSCert: srv.CertFile, TLSKey: srv.KeyFile}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.c.Options()
			if err != nil {
				t.Fatal(err)
			}
			c := o.New()
			defer c.Close()
			err = c.Ping(context.Background()).Err()
			if (err == nil) != tc.ok {
				t.Errorf("PING: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// The topology parameters: the gate's own as a whole, else the
// deployment's; redis_addrs as an array or a comma-separated string.
func TestTopologyFromParams(t *testing.T) {
	env := gate.Env{RedisMode: "sentinel", RedisAddrs: []string{"s:2"}, RedisMasterName: "dep"}
	for _, tc := range []struct {
		name   string
		params string
		want   redisclient.Topology
		err    string
	}{
		{"deployment's", `{}`, redisclient.Topology{Mode: redisclient.Sentinel, Addrs: []string{"s:2"}, MasterName: "dep"}, ""},
		{"own mode only", `{"redis_mode":"standalone"}`, redisclient.Topology{Mode: redisclient.Single}, ""},
		{"own sentinel, array", `{"redis_mode":"sentinel","redis_master_name":"m","redis_addrs":["a:1","b:2"]}`,
			redisclient.Topology{Mode: redisclient.Sentinel, Addrs: []string{"a:1", "b:2"}, MasterName: "m"}, ""},
		{"own sentinel, string", `{"redis_mode":"sentinel","redis_master_name":"m","redis_addrs":"a:1, b:2"}`,
			redisclient.Topology{Mode: redisclient.Sentinel, Addrs: []string{"a:1", "b:2"}, MasterName: "m"}, ""},
		{"master name without mode", `{"redis_master_name":"m"}`, redisclient.Topology{}, "needs mode sentinel"},
		{"addrs not strings", `{"redis_mode":"cluster","redis_addrs":[1]}`, redisclient.Topology{}, "array of host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.params), &obj); err != nil {
				t.Fatal(err)
			}
			p, err := gate.ParseParams(obj)
			if err != nil {
				t.Fatal(err)
			}
			got, err := TopologyFromParams(p, env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got.Mode != tc.want.Mode || got.MasterName != tc.want.MasterName || !slices.Equal(got.Addrs, tc.want.Addrs) {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if err := p.Unused(); err != nil {
				t.Errorf("unused: %v", err)
			}
		})
	}
}
