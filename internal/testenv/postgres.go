package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Postgres is a PostgreSQL server started for a test, on 127.0.0.1 with
// trust authentication (user postgres, database postgres).
type Postgres struct {
	// URL is postgres://postgres@127.0.0.1:port/postgres?sslmode=disable.
	URL  string
	Port int

	bin    string
	dir    string // data directory
	tmp    string // removed by Stop
	cred   *syscall.Credential
	cmd    *exec.Cmd
	exited chan struct{}
	logf   *os.File
}

const postgresPkg = "postgresql"

// postgresBin finds the directory of initdb and postgres: PATH first, then
// Debian's /usr/lib/postgresql/<version>/bin (the newest version).
func postgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL server (initdb, postgres) not found in PATH nor in /usr/lib/postgresql/*/bin: install the Debian package %q (apt-get install -y %s); .ci/run does this", postgresPkg, postgresPkg)
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// serverCredential returns the user the server runs as: postgres refuses
// to run as root, so as root it is the "postgres" user if there is one (the
// Debian package creates it), else "nobody"; nil (this process's user)
// otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("running as root, and neither user postgres nor nobody exists to run the server as: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// StartPostgres initialises a fresh cluster in a temporary directory,
// starts postgres on a free 127.0.0.1 port, waits until it accepts
// connections, and stops it (by PID) at the end of the test.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	p, err := StartPostgresProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// StartPostgresProcess is StartPostgres outside tests (for bench); the
// caller stops it with Stop.
func StartPostgresProcess() (*Postgres, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "postgres-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	p := &Postgres{bin: bin, dir: filepath.Join(tmp, "data"), tmp: tmp, cred: cred}
	if err := os.Mkdir(p.dir, 0o700); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(p.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, fmt.Errorf("give the data directory to uid %d: %w", cred.Uid, err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", p.dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	initdb.Dir = tmp
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	DieWithParent(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if p.Port, err = freePort(); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
	if err := p.Start(); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// Start starts the server on its port and data directory (after Crash) and
// waits until it accepts connections.
func (p *Postgres) Start() error {
	if p.cmd != nil {
		return errors.New("postgres is running")
	}
	logf, err := os.OpenFile(filepath.Join(p.tmp, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("postgres log: %w", err)
	}
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", p.dir, "-p", strconv.Itoa(p.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off",
		"-c", "max_connections=300", "-c", "shared_buffers=64MB")
	cmd.Dir = p.tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	DieWithParent(cmd)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	p.cmd, p.logf, p.exited = cmd, logf, make(chan struct{})
	go func() { _ = cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, p.URL)
		if err == nil {
			err = c.Ping(ctx)
			_ = c.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("postgres exited at start (log: %s)", filepath.Join(p.tmp, "postgres.log"))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres on port %d did not come up: %w (log: %s)", p.Port, err, filepath.Join(p.tmp, "postgres.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Crash stops the server as a crash does: an immediate shutdown (SIGQUIT to
// its PID: no checkpoint, every connection cut, WAL replayed at the next
// Start), SIGKILL if it is still there after 10 s.
func (p *Postgres) Crash() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
	p.logf.Close()
}

// Stop stops the server (by PID) and removes its data; safe to call twice.
func (p *Postgres) Stop() {
	p.Crash()
	if p.tmp != "" {
		_ = os.RemoveAll(p.tmp)
		p.tmp = ""
	}
}

// CreateRacing runs create, a CREATE TABLE IF NOT EXISTS (or several), and
// runs it again when it lost a race with another session creating the same
// table at that moment (sluice's broker, in a test that also writes rows
// itself): PostgreSQL then fails the loser on its catalog's unique indexes
// (SQLSTATE 42710, 23505 or 42P07) instead of seeing the table. Any other
// error, or the race lost five times, is returned.
func CreateRacing(ctx context.Context, create func(context.Context) error) error {
	var err error
	for attempt := range 5 {
		if err = create(ctx); err == nil {
			return nil
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "42710" && pe.Code != "23505" && pe.Code != "42P07") {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return err
}
