package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// StartPrometheusProcess is StartPrometheusWith outside tests (for the
// chaos harness): prometheus on 127.0.0.1:port (0: a free one) with its
// configuration and storage in dir, which the caller owns (pass the same
// port and dir to start it again where it was). It waits until prometheus
// is ready and has scraped every target once; the caller stops it.
func StartPrometheusProcess(o PrometheusOptions, port int, dir string) (*PrometheusProcess, error) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		return nil, fmt.Errorf("prometheus not found in PATH: install the Debian package \"prometheus\" (apt-get install -y prometheus)")
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = time.Second
	}
	conf, err := prometheusConfig(o)
	if err != nil {
		return nil, fmt.Errorf("prometheus config: %w", err)
	}
	confFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("prometheus config: %w", err)
	}
	if port == 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin,
		"--config.file="+confFile,
		"--web.listen-address="+addr,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--storage.tsdb.retention.time=1h",
		"--log.level=warn",
	)
	DieWithParent(cmd)
	logFile, err := os.OpenFile(filepath.Join(dir, "prometheus.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("prometheus log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start prometheus: %w", err)
	}
	p := &PrometheusProcess{URL: "http://" + addr, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.exited) }()
	if err := (&Prometheus{URL: p.URL}).waitReady(len(o.Targets), 30*time.Second); err != nil {
		p.Stop()
		log, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
		return nil, fmt.Errorf("prometheus on %s did not come up: %v\n%s", addr, err, log)
	}
	return p, nil
}

// PrometheusProcess is a prometheus started by StartPrometheusProcess.
type PrometheusProcess struct {
	// URL is the server's base URL (http://127.0.0.1:port).
	URL    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Stop kills the server (SIGKILL, by its PID) and waits for it; safe to
// call twice.
func (p *PrometheusProcess) Stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}
