package main

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

// --redis.mode, --redis.addrs and --redis.master-name set the deployment's
// topology; the CLI tools take the same flags.
func TestRedisTopologyFlags(t *testing.T) {
	f := &serveFlags{}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse([]string{"--redis.mode", "sentinel", "--redis.addrs", "s2:26379,s3:26379", "--redis.master-name", "mymaster"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.load(fs)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RedisMode != "sentinel" || cfg.RedisMasterName != "mymaster" || !slices.Equal(cfg.RedisAddrs, []string{"s2:26379", "s3:26379"}) {
		t.Errorf("config %q %q %v", cfg.RedisMode, cfg.RedisMasterName, cfg.RedisAddrs)
	}

	var rf redisFlags
	tfs := pflag.NewFlagSet("enqueue", pflag.ContinueOnError)
	rf.register(tfs)
	if err := tfs.Parse([]string{"--redis.url", "redis://127.0.0.1:1/0", "--redis.mode", "sentinel"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rf.dial(); err == nil {
		t.Error("--redis.mode sentinel without --redis.master-name was accepted")
	}
}
