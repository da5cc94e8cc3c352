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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a cluster of nats-server processes with JetStream on
// 127.0.0.1 (one node is a cluster of one).
type NATSCluster struct {
	// URL lists every node's client URL, comma-separated (the form
	// nats.Connect takes), so a client fails over between them.
	URL   string
	nodes []*natsNode
	tmp   string // removed by Stop
}

type natsNode struct {
	name        string
	port, route int
	dir         string
	args        []string
	cmd         *exec.Cmd
	exited      chan struct{}
	logf        *os.File
}

const natsPkg = "nats-server"

func natsNotFound() error {
	return fmt.Errorf("nats-server not found in PATH: install the Debian package %q (apt-get install -y %s); .ci/run does this", natsPkg, natsPkg)
}

// StartNATSCluster starts n nats-server nodes with JetStream (clustered
// when n > 1) on free loopback ports, waits until JetStream answers, and
// stops them (by PID) at the end of the test.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	LookPath(t, "nats-server", natsPkg)
	c, err := StartNATSClusterProcess(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartNATSClusterProcess is StartNATSCluster outside tests (for bench);
// the caller stops it with Stop.
func StartNATSClusterProcess(n int) (*NATSCluster, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return nil, natsNotFound()
	}
	if n < 1 {
		n = 1
	}
	tmp, err := os.MkdirTemp("", "nats-")
	if err != nil {
		return nil, err
	}
	c := &NATSCluster{tmp: tmp}
	ports := make([]int, 2*n)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
	}
	var routes, urls []string
	for i := range n {
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(ports[2*i+1]))
		urls = append(urls, "nats://127.0.0.1:"+strconv.Itoa(ports[2*i]))
	}
	c.URL = strings.Join(urls, ",")
	for i := range n {
		nd := &natsNode{name: fmt.Sprintf("n%d", i+1), port: ports[2*i], route: ports[2*i+1], dir: filepath.Join(tmp, fmt.Sprintf("n%d", i+1))}
		nd.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(nd.port), "-n", nd.name, "-js", "-sd", nd.dir}
		if n > 1 {
			nd.args = append(nd.args, "--cluster_name", "sluice-test", "--cluster", "nats://127.0.0.1:"+strconv.Itoa(nd.route),
				"--routes", strings.Join(routes, ","))
		}
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		if err := nd.start(bin); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitReady(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (nd *natsNode) start(bin string) error {
	if err := os.MkdirAll(nd.dir, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(nd.dir+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("nats log: %w", err)
	}
	cmd := exec.Command(bin, nd.args...)
	DieWithParent(cmd)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start nats-server %s: %w", nd.name, err)
	}
	nd.cmd, nd.logf, nd.exited = cmd, logf, make(chan struct{})
	go func() { _ = cmd.Wait(); close(nd.exited) }()
	return nil
}

// WaitReady waits until every running node accepts connections and
// JetStream answers through the cluster (a meta leader is elected).
func (c *NATSCluster) WaitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		if last = c.ready(); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("nats cluster %s not ready within %s: %w (logs in %s)", c.URL, within, last, c.tmp)
}

func (c *NATSCluster) ready() error {
	for _, nd := range c.nodes {
		if nd.cmd == nil {
			continue
		}
		nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(nd.port), nats.Timeout(time.Second), nats.NoReconnect())
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
		}
		nc.Close()
		if err != nil {
			return fmt.Errorf("node %s: %w", nd.name, err)
		}
	}
	return nil
}

// Nodes is how many nodes the cluster has.
func (c *NATSCluster) Nodes() int { return len(c.nodes) }

// NodeURL is node i's client URL.
func (c *NATSCluster) NodeURL(i int) string {
	return "nats://127.0.0.1:" + strconv.Itoa(c.nodes[i].port)
}

// Kill kills node i with SIGKILL (by its PID) and waits for it to exit.
func (c *NATSCluster) Kill(i int) {
	nd := c.nodes[i]
	if nd.cmd == nil {
		return
	}
	_ = nd.cmd.Process.Kill()
	<-nd.exited
	nd.cmd = nil
	nd.logf.Close()
}

// Restart starts node i again on its ports and data directory.
func (c *NATSCluster) Restart(i int) error {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return natsNotFound()
	}
	if c.nodes[i].cmd != nil {
		return errors.New("node is running")
	}
	return c.nodes[i].start(bin)
}

// Stop kills every node (by PID) and removes the data; safe to call twice.
func (c *NATSCluster) Stop() {
	for i := range c.nodes {
		c.Kill(i)
	}
	if c.tmp != "" {
		_ = os.RemoveAll(c.tmp)
		c.tmp = ""
	}
}
