package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of StartRedisSentinel monitor
// their master under.
const SentinelMaster = "sluice-master"

// RedisSentinel is a master, its replica and three sentinels watching them,
// all real redis-server processes on 127.0.0.1, started for a test. The
// sentinels run as `redis-server <conf> --sentinel` (what the Debian
// package redis-sentinel's binary is a link to), so the package
// redis-server is all it needs.
type RedisSentinel struct {
	// Master and Replica are the data servers as started: after Failover,
	// Replica is the master and Master its replica.
	Master, Replica *Redis
	// Sentinels are the sentinels' host:port addresses.
	Sentinels []string
	// MasterName is SentinelMaster.
	MasterName string
	// URL is a sentinel URL as sluice and upstream read it in sentinel
	// mode: redis://<first sentinel>/0, with the other sentinels given as
	// Sentinels[1:] (addrs).
	URL string

	procs []*exec.Cmd
	logs  []*os.File
}

// StartRedisSentinel starts the master, one replica attached to it and
// three sentinels (quorum 2, down-after 1 s), and stops them all at the end
// of the test. It returns once every sentinel knows the replica and the two
// other sentinels, so that Failover can succeed at once.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	bin := LookPath(t, "redis-server", "redis-server")
	s := &RedisSentinel{MasterName: SentinelMaster}
	t.Cleanup(s.Stop)
	// No diskless-sync delay (5 s by default): a replica attaches at once.
	fast := []string{"--repl-diskless-sync-delay", "0"}
	s.Master = StartRedis(t, RedisOptions{Args: fast})
	s.Replica = StartRedis(t, RedisOptions{Args: append(fast, "--replicaof", "127.0.0.1", portOf(s.Master.Addr))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The replica is attached before the sentinels start, so that their
	// first INFO of the master lists it (the next comes 10 s later).
	if err := waitInfo(ctx, s.Replica.Addr, "master_link_status:up"); err != nil {
		t.Fatalf("redis sentinel set-up: %v", err)
	}
	dir := t.TempDir()
	for i := range 3 {
		addr, err := s.startSentinel(bin, dir, i)
		if err != nil {
			t.Fatal(err)
		}
		s.Sentinels = append(s.Sentinels, addr)
	}
	s.URL = "redis://" + s.Sentinels[0] + "/0"
	if err := s.waitReady(ctx); err != nil {
		t.Fatalf("redis sentinel set-up: %v", err)
	}
	return s
}

// startSentinel starts sentinel i on a free port with its own (writable)
// config file.
func (s *RedisSentinel) startSentinel(bin, dir string, i int) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", i))
	body := fmt.Sprintf("bind 127.0.0.1\nport %d\nprotected-mode no\ndir %s\n"+
		"sentinel monitor %s 127.0.0.1 %s 2\n"+
		"sentinel down-after-milliseconds %[3]s 1000\n"+
		"sentinel failover-timeout %[3]s 10000\n"+
		"sentinel parallel-syncs %[3]s 1\n", port, dir, s.MasterName, portOf(s.Master.Addr))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return "", err
	}
	cmd := exec.Command(bin, conf, "--sentinel", "--loglevel", "warning")
	DieWithParent(cmd)
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("sentinel-%d.log", i)))
	if err != nil {
		return "", err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", fmt.Errorf("start redis-server --sentinel: %w", err)
	}
	s.procs, s.logs = append(s.procs, cmd), append(s.logs, logf)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitRedis(addr, "", 10*time.Second); err != nil {
		b, _ := os.ReadFile(logf.Name())
		return "", fmt.Errorf("sentinel on %s did not come up (this redis-server may lack sentinel mode: install the Debian package \"redis-sentinel\"): %w; log:\n%s", addr, err, b)
	}
	return addr, nil
}

// waitReady waits until the first sentinel (the one Failover asks) reports
// the replica, connected, and every sentinel answers for the master.
func (s *RedisSentinel) waitReady(ctx context.Context) error {
	for i, a := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		err := poll(ctx, func() error {
			if i > 0 {
				return sc.GetMasterAddrByName(ctx, s.MasterName).Err()
			}
			reps, err := sc.Replicas(ctx, s.MasterName).Result()
			if err != nil {
				return err
			}
			for _, r := range reps {
				if r["name"] == s.Replica.Addr && !strings.Contains(r["flags"], "down") && !strings.Contains(r["flags"], "disconnected") &&
					r["master-link-status"] == "ok" {
					return nil
				}
			}
			return fmt.Errorf("sentinel %s does not know replica %s yet: %v", a, s.Replica.Addr, reps)
		})
		sc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// MasterAddr is the master's host:port as the first sentinel reports it.
func (s *RedisSentinel) MasterAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0]})
	defer sc.Close()
	a, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// Failover makes the sentinels promote the replica (SENTINEL FAILOVER) and
// waits until every sentinel reports it as the master and it says
// role:master; then it makes the old master a replica of the new one
// (REPLICAOF, what the sentinels would do themselves only some seconds
// later, a split brain meanwhile) and waits until it is attached. It
// returns the new master's address. Master and Replica are swapped.
//
// A write the old master acknowledged after the promotion and before its
// REPLICAOF is lost, as in any Redis failover: replication is
// asynchronous.
func (s *RedisSentinel) Failover(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	old, err := s.MasterAddr(ctx)
	if err != nil {
		return "", fmt.Errorf("failover: master before: %w", err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0]})
	err = poll(ctx, func() error { return sc.Failover(ctx, s.MasterName).Err() })
	sc.Close()
	if err != nil {
		return "", fmt.Errorf("SENTINEL FAILOVER %s: %w", s.MasterName, err)
	}
	var now string
	for _, a := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		err := poll(ctx, func() error {
			m, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
			if err != nil {
				return err
			}
			if now = net.JoinHostPort(m[0], m[1]); now == old {
				return fmt.Errorf("sentinel %s still reports %s as the master", a, old)
			}
			return nil
		})
		sc.Close()
		if err != nil {
			return "", fmt.Errorf("failover: %w", err)
		}
	}
	if now != s.Replica.Addr {
		return "", fmt.Errorf("failover: the sentinels report %s as the master, want the replica %s", now, s.Replica.Addr)
	}
	if err := waitInfo(ctx, now, "role:master"); err != nil {
		return "", fmt.Errorf("failover: %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: old})
	err = c.ReplicaOf(ctx, "127.0.0.1", portOf(now)).Err()
	c.Close()
	if err != nil {
		return "", fmt.Errorf("failover: REPLICAOF on the old master %s: %w", old, err)
	}
	if err := waitInfo(ctx, old, "master_link_status:up"); err != nil {
		return "", fmt.Errorf("failover: %w", err)
	}
	s.Master, s.Replica = s.Replica, s.Master
	return now, nil
}

// waitInfo waits until INFO replication of the server at addr contains want.
func waitInfo(ctx context.Context, addr, want string) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	return poll(ctx, func() error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, want) {
			return fmt.Errorf("%s does not say %s yet", addr, want)
		}
		return nil
	})
}

// Stop kills the sentinels (by PID; the data servers are stopped by their
// own cleanups); safe to call twice.
func (s *RedisSentinel) Stop() {
	for i, c := range s.procs {
		if c.Process != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		s.logs[i].Close()
	}
	s.procs, s.logs = nil, nil
}

// poll calls f every 50 ms until it returns nil or ctx ends (then the last
// error is returned).
func poll(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
