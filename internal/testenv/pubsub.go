package testenv

import (
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

// StartPubSubEmulator starts the Pub/Sub emulator of google-cloud-cli on a
// free 127.0.0.1 port, waits until it accepts connections, and kills it (by
// its PID) at the end of the test. It returns host:port; it sets no
// environment variable (pass it to the client, e.g. as PUBSUB_EMULATOR_HOST
// through the transport's emulator_host option).
func StartPubSubEmulator(t testing.TB) string {
	t.Helper()
	bin := PubSubEmulatorPath
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("Pub/Sub emulator not found at %s: install the Debian package %q (apt-get install -y google-cloud-cli-pubsub-emulator); .ci/run does this", bin, "google-cloud-cli-pubsub-emulator")
	}
	LookPath(t, "java", "default-jre-headless")
	port := FreePort(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--host=127.0.0.1", "--port="+strconv.Itoa(port))
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(dir, "pubsub-emulator.log"))
	if err != nil {
		t.Fatalf("emulator log: %v", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the Pub/Sub emulator: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("Pub/Sub emulator on %s did not come up within 60s: %v\n%s", addr, err, log)
		}
		if cmd.ProcessState != nil {
			t.Fatalf("Pub/Sub emulator exited early: %s", fmt.Sprint(cmd.ProcessState))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
