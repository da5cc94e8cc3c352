package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// PubSubEmulatorPath is where google-cloud-cli installs the Pub/Sub emulator.
const PubSubEmulatorPath = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"

// PubSubEmulator is a Pub/Sub emulator process.
type PubSubEmulator struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	stop func()
}

// StartPubSubEmulator starts the Pub/Sub emulator of google-cloud-cli on a
// free 127.0.0.1 port, waits until it accepts connections, and kills it (by
// its PID) at the end of the test. It returns host:port; it sets no
// environment variable (pass it to the client, e.g. through the
// transport's emulator_host option).
func StartPubSubEmulator(t testing.TB) string {
	t.Helper()
	e, err := StartPubSubEmulatorProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e.Addr
}

// StartPubSubEmulatorProcess is StartPubSubEmulator outside tests (for
// bench); the caller stops it.
func StartPubSubEmulatorProcess() (*PubSubEmulator, error) {
	bin := PubSubEmulatorPath
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("Pub/Sub emulator not found at %s: install the Debian package \"google-cloud-cli-pubsub-emulator\" (apt-get install -y google-cloud-cli-pubsub-emulator); .ci/run does this", bin)
	}
	if _, err := exec.LookPath("java"); err != nil {
		return nil, errors.New("java not found in PATH (the Pub/Sub emulator needs it): install the Debian package \"default-jre-headless\" (apt-get install -y default-jre-headless)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "pubsub-emulator-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--host=127.0.0.1", "--port="+strconv.Itoa(port))
	cmd.Dir = dir
	DieWithParent(cmd) // the script execs java, which keeps the death signal
	logf, err := os.Create(filepath.Join(dir, "pubsub-emulator.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("emulator log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start the Pub/Sub emulator: %w", err)
	}
	e := &PubSubEmulator{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stopped := func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		os.RemoveAll(dir)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", e.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			e.stop = stopped
			return e, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			stopped()
			return nil, fmt.Errorf("Pub/Sub emulator exited early:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			stopped()
			return nil, fmt.Errorf("Pub/Sub emulator on %s did not come up within 60s: %v\n%s", e.Addr, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop kills the emulator (by its PID) and waits for it; safe to call twice.
func (e *PubSubEmulator) Stop() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
}
