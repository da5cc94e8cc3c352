package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// RedisTLS is a redis-server listening only on a TLS port, which requires
// a client certificate signed by its test CA.
type RedisTLS struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// URL is rediss://addr/0.
	URL string
	// CAFile is the PEM of the CA that signed the server's and the client's certificates.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM).
	CertFile, KeyFile string
	cmd               *exec.Cmd
	logf              *os.File
}

// StartRedisTLS generates a CA, a server certificate for 127.0.0.1 and a
// client certificate in the test's temp dir, starts redis-server with
// --tls-port only (no plain port) and --tls-auth-clients yes, and stops it
// (by PID) at the end of the test. Debian's redis-server is built with TLS.
func StartRedisTLS(t testing.TB) *RedisTLS {
	t.Helper()
	bin := LookPath(t, "redis-server", "redis-server")
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, "sluice test CA", true)
	srvCert, srvKey := newCert(t, ca, caKey, "127.0.0.1", false)
	cliCert, cliKey := newCert(t, ca, caKey, "sluice client", false)
	r := &RedisTLS{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "client.pem"), KeyFile: filepath.Join(dir, "client.key")}
	srvCertFile, srvKeyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	writePEM(t, r.CAFile, "CERTIFICATE", ca.Raw)
	writePEM(t, srvCertFile, "CERTIFICATE", srvCert.Raw)
	writeKey(t, srvKeyFile, srvKey)
	writePEM(t, r.CertFile, "CERTIFICATE", cliCert.Raw)
	writeKey(t, r.KeyFile, cliKey)

	port := FreePort(t)
	r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	r.URL = "rediss://" + r.Addr + "/0"
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", srvCertFile, "--tls-key-file", srvKeyFile, "--tls-ca-cert-file", r.CAFile,
		"--tls-auth-clients", "yes", "--dir", dir, "--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning")
	DieWithParent(cmd)
	logf, err := os.Create(filepath.Join(dir, "redis-tls.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start redis-server with TLS: %v", err)
	}
	r.cmd, r.logf = cmd, logf
	t.Cleanup(r.Stop)
	if err := r.wait(10 * time.Second); err != nil {
		log, _ := os.ReadFile(logf.Name())
		t.Fatalf("redis-server with --tls-port on %s did not come up (is it built with TLS?): %v\n%s", r.Addr, err, log)
	}
	return r
}

// ClientTLS returns the TLS configuration of a client holding the test's
// client certificate and trusting its CA.
func (r *RedisTLS) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(r.CertFile, r.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(r.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}, ServerName: "127.0.0.1"}
}

// Stop kills the server (by its PID) and waits for it; safe to call twice.
func (r *RedisTLS) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
	r.logf.Close()
}

// wait polls until a TLS connection (without a client certificate: the
// handshake itself tells the server is up) is answered.
func (r *RedisTLS) wait(within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", r.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// newCert makes a certificate signed by parent (self-signed when parent is
// nil): a CA, or a leaf for name (an IP address gets an IP SAN).
func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t testing.TB, path string, key *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(fmt.Errorf("marshal key: %w", err))
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}
