package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// StartPubSubEmulatorOnPort starts the Pub/Sub emulator on the given port
// of 127.0.0.1 (to restart one where its clients expect it; the emulator
// keeps no state, so topics and subscriptions must be created again) and
// waits until it accepts connections. The caller stops it.
func StartPubSubEmulatorOnPort(port int) (*PubSubEmulator, error) {
	bin := PubSubEmulatorPath
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("Pub/Sub emulator not found at %s: install the Debian package \"google-cloud-cli-pubsub-emulator\" (apt-get install -y google-cloud-cli-pubsub-emulator); .ci/run does this", bin)
	}
	if _, err := exec.LookPath("java"); err != nil {
		return nil, errors.New("java not found in PATH (the Pub/Sub emulator needs it): install the Debian package \"default-jre-headless\" (apt-get install -y default-jre-headless)")
	}
	dir, err := os.MkdirTemp("", "pubsub-emulator-")
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
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
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		os.RemoveAll(dir)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return &PubSubEmulator{Addr: addr, stop: stop}, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			stop()
			return nil, fmt.Errorf("Pub/Sub emulator on %s exited early:\n%s", addr, log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			stop()
			return nil, fmt.Errorf("Pub/Sub emulator on %s did not come up within 60s: %v\n%s", addr, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
