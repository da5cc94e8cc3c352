// Package testenv starts the real servers tests need (redis-server, ...) on
// free loopback ports, and stops them (by PID) when the test ends. A missing
// server fails the test loudly, naming the Debian package to install: it
// never skips.
package testenv

import (
	"bufio"
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
)

// Redis is a redis-server started for a test.
type Redis struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// URL is redis://[:password@]addr/0.
	URL string
	// Password is the AUTH password ("" when none).
	Password string
	cmd      *exec.Cmd
	dir      string
	logf     *os.File
	tmp      string // removed by Stop
}

// RedisOptions configure StartRedis.
type RedisOptions struct {
	// Password enables AUTH (requirepass).
	Password string
	// Persist keeps an append-only file in the test's temp dir (for restart tests).
	Persist bool
	// Dir reuses a data directory (with Persist, to restart on the same data).
	Dir string
	// Port reuses a port (0: a free one).
	Port int
	// Args are extra redis-server arguments (e.g. cluster mode), appended last.
	Args []string
	// Env is added to the server's environment (e.g. FakeClock.Env).
	Env []string
	// Wrap, when set, is a command that runs the server: redis-server and
	// its arguments are appended to it (e.g. valgrind and its options).
	Wrap []string
}

// LookPath finds a server binary or fails t with the package to install.
func LookPath(t testing.TB, bin, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("%s not found in PATH: install the Debian package %q (apt-get install -y %s); .ci/run does this", bin, pkg, pkg)
	}
	return p
}

// FreePort returns a free TCP port on 127.0.0.1.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// StartRedis starts redis-server on 127.0.0.1 and stops it at the end of the test.
func StartRedis(t testing.TB, o RedisOptions) *Redis {
	t.Helper()
	LookPath(t, "redis-server", "redis-server")
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	r, err := StartRedisProcess(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// StartRedisProcess starts redis-server on 127.0.0.1 outside a test (for
// benchmarks); the caller stops it with Stop. Without o.Dir it uses a new
// temporary directory, removed by Stop.
func StartRedisProcess(o RedisOptions) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH: install the Debian package \"redis-server\" (apt-get install -y redis-server)")
	}
	port := o.Port
	if port == 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	dir, tmp := o.Dir, ""
	if dir == "" {
		if dir, err = os.MkdirTemp("", "redis-"); err != nil {
			return nil, err
		}
		tmp = dir
	}
	args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--save", "", "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"}
	if o.Persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if o.Password != "" {
		args = append(args, "--requirepass", o.Password)
	}
	args = append(args, o.Args...)
	cmd := exec.Command(bin, args...)
	if len(o.Wrap) > 0 {
		cmd = exec.Command(o.Wrap[0], append(append(o.Wrap[1:len(o.Wrap):len(o.Wrap)], bin), args...)...)
	}
	if len(o.Env) > 0 {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	DieWithParent(cmd)
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)))
	if err != nil {
		return nil, fmt.Errorf("redis log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Password: o.Password, cmd: cmd, dir: dir, logf: logf, tmp: tmp}
	r.URL = "redis://" + r.Addr + "/0"
	if o.Password != "" {
		r.URL = "redis://:" + o.Password + "@" + r.Addr + "/0"
	}
	if err := waitRedis(r.Addr, o.Password, 10*time.Second); err != nil {
		r.Stop()
		return nil, fmt.Errorf("redis-server on %s did not come up: %w", r.Addr, err)
	}
	return r, nil
}

// PID is the server's process id (the wrapper's, with RedisOptions.Wrap).
func (r *Redis) PID() int { return r.cmd.Process.Pid }

// Dir is the server's data directory.
func (r *Redis) Dir() string { return r.dir }

// Stop kills the server (by its PID) and waits for it; safe to call twice.
func (r *Redis) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
	if r.logf != nil {
		r.logf.Close()
	}
	if r.tmp != "" {
		_ = os.RemoveAll(r.tmp)
	}
}

// waitRedis polls until the server answers PING.
func waitRedis(addr, password string, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if password != "" {
				fmt.Fprintf(c, "AUTH %s\r\n", password)
			}
			fmt.Fprintf(c, "PING\r\n")
			br := bufio.NewReader(c)
			var line string
			for i := 0; i < 2; i++ {
				line, err = br.ReadString('\n')
				if err != nil || strings.Contains(line, "PONG") {
					break
				}
			}
			c.Close()
			if err == nil && strings.Contains(line, "PONG") {
				return nil
			}
			last = fmt.Errorf("reply %q: %v", line, err)
		} else {
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// Signal sends sig to the server's process (SIGSTOP and SIGCONT freeze and
// resume it, as a stalled replica).
func (r *Redis) Signal(sig os.Signal) error {
	if r.cmd == nil || r.cmd.Process == nil {
		return errors.New("redis-server is not running")
	}
	return r.cmd.Process.Signal(sig)
}
