package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-io/sluice/internal/testenv"
)

// rig is what one fault runs on: the sluice binary, a temp dir, and the
// servers and replicas it started (stopped by PID when the fault ends).
type rig struct {
	name string
	bin  string
	dir  string

	mu       sync.Mutex
	red      *testenv.Redis
	redOpts  testenv.RedisOptions
	emu      *testenv.PubSubEmulator
	replicas []*replica
	seq      int
	stops    []func() // other servers' stops, run by close
}

func newRig(bin, root, name string) (*rig, error) {
	dir, err := os.MkdirTemp(root, name+"-")
	if err != nil {
		return nil, err
	}
	return &rig{name: name, bin: bin, dir: dir}, nil
}

// close stops every replica and server the rig started.
func (r *rig) close() {
	r.mu.Lock()
	reps := r.replicas
	r.mu.Unlock()
	for _, p := range reps {
		p.kill()
	}
	if r.red != nil {
		r.red.Stop()
	}
	if r.emu != nil {
		r.emu.Stop()
	}
	for _, stop := range r.stops {
		stop()
	}
}

// onClose registers the stop of a server the rig's broker started.
func (r *rig) onClose(stop func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stops = append(r.stops, stop)
}

// redis starts the rig's redis-server once (with an append-only file
// fsynced on every write when persist).
func (r *rig) redis(persist bool) (*testenv.Redis, error) {
	if r.red != nil {
		return r.red, nil
	}
	o := testenv.RedisOptions{Persist: persist}
	if persist {
		o.Dir = filepath.Join(r.dir, "redis-data")
		if err := os.MkdirAll(o.Dir, 0o700); err != nil {
			return nil, err
		}
	}
	srv, err := testenv.StartRedisProcess(o)
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(srv.Addr)
	o.Port, _ = strconv.Atoi(port)
	r.red, r.redOpts = srv, o
	return srv, nil
}

// restartRedis kills redis-server (SIGKILL), waits gone, and starts it
// again on the same port and data directory.
func (r *rig) restartRedis(gone time.Duration) error {
	if r.red == nil {
		return fmt.Errorf("no redis-server to restart")
	}
	r.red.Stop()
	time.Sleep(gone)
	srv, err := testenv.StartRedisProcess(r.redOpts)
	if err != nil {
		return fmt.Errorf("restart redis-server: %w", err)
	}
	r.red = srv
	return nil
}

// emulator starts the rig's Pub/Sub emulator once and returns host:port.
func (r *rig) emulator() (string, error) {
	if r.emu != nil {
		return r.emu.Addr, nil
	}
	e, err := testenv.StartPubSubEmulatorProcess()
	if err != nil {
		return "", err
	}
	r.emu = e
	return e.Addr, nil
}

// restartEmulator kills the emulator and starts a new one on the same port.
func (r *rig) restartEmulator() error {
	_, port, _ := net.SplitHostPort(r.emu.Addr)
	p, _ := strconv.Atoi(port)
	r.emu.Stop()
	e, err := testenv.StartPubSubEmulatorOnPort(p)
	if err != nil {
		return err
	}
	r.emu = e
	return nil
}

// replicaPIDs lists the processes of the replicas still running.
func (r *rig) replicaPIDs() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pids []int
	for _, p := range r.replicas {
		if p.alive() {
			pids = append(pids, p.cmd.Process.Pid)
		}
	}
	return pids
}

// killedPIDs lists the processes of the replicas the harness killed.
func (r *rig) killedPIDs() map[int]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int]bool{}
	for _, p := range r.replicas {
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if stopped && !p.alive() {
			out[p.cmd.Process.Pid] = true
		}
	}
	return out
}

// sluiceConfig is the config file of a deployment: the broker's transport
// and the fault's settings.
type sluiceConfig map[string]any

// writeConfig writes a sluice config file and returns its path.
func (r *rig) writeConfig(cfg sluiceConfig) (string, error) {
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	r.seq++
	path := filepath.Join(r.dir, fmt.Sprintf("sluice-%d.json", r.seq))
	r.mu.Unlock()
	return path, os.WriteFile(path, b, 0o600)
}

// baseConfig is a deployment of b against gateway gw with concurrency c.
func baseConfig(b broker, gw string, c int) sluiceConfig {
	tr, tc, url := b.deployment(gw)
	cfg := sluiceConfig{
		"transport": tr, "transport_config": tc, "concurrency": c,
		"metrics_port": -1, "drain_timeout": "10s", "request_timeout": "30s",
		"retry": map[string]any{"base": "200ms", "max": "2s", "jitter": 0.2},
		"log":   map[string]any{"level": "warn"},
	}
	if url != "" {
		cfg["redis_url"] = url
	}
	return cfg
}

// replica is one sluice child process.
type replica struct {
	name    string
	cmd     *exec.Cmd
	health  string // http://127.0.0.1:port
	logPath string
	exited  chan struct{}
	started time.Time

	mu      sync.Mutex
	state   *os.ProcessState
	stopped bool // the harness stopped it (kill or term)
}

// startReady starts a replica (startReplica) and waits up to a minute for
// it to be ready.
func (r *rig) startReady(ctx context.Context, cfgPath string) (*replica, error) {
	p, err := r.startReplica("replica", cfgPath)
	if err == nil {
		err = p.waitReady(ctx, 60*time.Second)
	}
	return p, err
}

// startReplica runs `sluice serve --config cfgPath` with its health port
// on a free port, logging to a file in the rig's dir.
func (r *rig) startReplica(name, cfgPath string) (*replica, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r.mu.Lock()
	r.seq++
	logPath := filepath.Join(r.dir, fmt.Sprintf("%s-%d.log", name, r.seq))
	r.mu.Unlock()
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	health := "http://127.0.0.1:" + strconv.Itoa(port)
	if spec, ok := strings.CutPrefix(cfgPath, bareSpecPrefix); ok {
		// The control: a bare Pub/Sub client (this program) instead of sluice.
		self, err := os.Executable()
		if err != nil {
			logf.Close()
			return nil, err
		}
		cmd = exec.Command(self)
		cmd.Env = append(os.Environ(), bareSubscriberEnv+"="+spec)
		health = ""
	} else {
		cmd = exec.Command(r.bin, "serve", "--config", cfgPath, "--health-port", strconv.Itoa(port), "--listen-host", "127.0.0.1")
	}
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	testenv.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &replica{name: name, cmd: cmd, health: health, logPath: logPath,
		exited: make(chan struct{}), started: time.Now()}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(p.exited)
	}()
	r.mu.Lock()
	r.replicas = append(r.replicas, p)
	r.mu.Unlock()
	return p, nil
}

// waitReady polls /readyz until it answers 200 or within passes.
func (p *replica) waitReady(ctx context.Context, within time.Duration) error {
	if p.health == "" {
		return nil // the bare subscriber has no health port
	}
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready: %s (log %s)", p.name, p.exitStatus(), p.logPath)
		default:
		}
		if resp, err := c.Get(p.health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %s (log %s)", p.name, within, p.logPath)
}

// alive reports whether the process still runs.
func (p *replica) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// crashed reports whether it exited without the harness stopping it.
func (p *replica) crashed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.alive() && !p.stopped
}

func (p *replica) exitStatus() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return "running"
	}
	return p.state.String()
}

// kill sends SIGKILL and waits for the process.
func (p *replica) kill() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	if p.alive() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.exited
}

// term sends SIGTERM and returns how long the process took to exit (or
// kills it after limit).
func (p *replica) term(limit time.Duration) (time.Duration, error) {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	select {
	case <-p.exited:
		took := time.Since(start)
		if !p.state.Success() {
			return took, fmt.Errorf("%s exited with %s after SIGTERM (log %s)", p.name, p.state, p.logPath)
		}
		return took, nil
	case <-time.After(limit):
		p.kill()
		return time.Since(start), fmt.Errorf("%s still running %s after SIGTERM; killed", p.name, limit)
	}
}
