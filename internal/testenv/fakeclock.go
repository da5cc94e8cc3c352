package testenv

import (
	"crypto/sha256"
	_ "embed" // the fake clock's source
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

//go:embed fakeclock/fakeclock.c
var fakeClockSrc []byte

// FakeClock steps the wall clock of the servers started with its Env (an
// LD_PRELOAD library, fakeclock/fakeclock.c, built once per machine with the
// C compiler): Set changes the offset while they run, and their next clock
// read sees it. Only the wall clock moves, as an NTP step moves it; the
// monotonic clock runs on.
type FakeClock struct {
	lib, path string
	f         *os.File
	off       time.Duration
}

var fakeClockBuild struct {
	once sync.Once
	lib  string
	err  error
}

// NewFakeClock builds the library if needed and makes an offset file (0)
// in t's temp dir. A missing C compiler fails t naming the Debian package.
func NewFakeClock(t testing.TB) *FakeClock {
	t.Helper()
	LookPath(t, "cc", "gcc")
	fakeClockBuild.once.Do(func() { fakeClockBuild.lib, fakeClockBuild.err = buildFakeClock() })
	if fakeClockBuild.err != nil {
		t.Fatal(fakeClockBuild.err)
	}
	path := filepath.Join(t.TempDir(), "clock-offset")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatalf("fake clock offset file: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	c := &FakeClock{lib: fakeClockBuild.lib, path: path, f: f}
	if err := c.Set(0); err != nil {
		t.Fatal(err)
	}
	return c
}

// buildFakeClock compiles the library into the user's cache directory,
// named by its source's hash, unless it is there.
func buildFakeClock() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256(fakeClockSrc)
	dir := filepath.Join(cache, "sluice-test")
	lib := filepath.Join(dir, "fakeclock-"+hex.EncodeToString(sum[:6])+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("fake clock: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "fakeclock-build-")
	if err != nil {
		return "", fmt.Errorf("fake clock: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "fakeclock.c")
	if err := os.WriteFile(src, fakeClockSrc, 0o644); err != nil {
		return "", fmt.Errorf("fake clock: %w", err)
	}
	out := filepath.Join(tmp, "fakeclock.so")
	if b, err := exec.Command("cc", "-shared", "-fPIC", "-O2", "-Wall", "-o", out, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the fake clock library (Debian package gcc): %v: %s", err, b)
	}
	// Another package's test may build it at the same time: the rename
	// is atomic, and both builds are the same.
	if err := os.Rename(out, lib); err != nil {
		return "", fmt.Errorf("fake clock: %w", err)
	}
	return lib, nil
}

// Env is the environment a server is started with to run on this clock
// (RedisOptions.Env).
func (c *FakeClock) Env() []string {
	return []string{"LD_PRELOAD=" + c.lib, "SLUICE_FAKECLOCK_FILE=" + c.path}
}

// Set makes the servers' wall clock run d ahead of the real one (behind
// when negative), from their next clock read on.
func (c *FakeClock) Set(d time.Duration) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(d.Nanoseconds()))
	if _, err := c.f.WriteAt(b[:], 0); err != nil {
		return fmt.Errorf("set the fake clock to %v: %w", d, err)
	}
	c.off = d
	return nil
}

// Offset is the offset last Set.
func (c *FakeClock) Offset() time.Duration { return c.off }
