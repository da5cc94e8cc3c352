package testenv

import (
	"fmt"
	"net"
	"testing"
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
// bench), on a free port; the caller stops it.
func StartPubSubEmulatorProcess() (*PubSubEmulator, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return StartPubSubEmulatorOnPort(port)
}

// Stop kills the emulator (by its PID) and waits for it; safe to call twice.
func (e *PubSubEmulator) Stop() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
}
