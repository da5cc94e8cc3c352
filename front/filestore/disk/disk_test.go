package disk

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/filestoretest"
)

func TestConformance(t *testing.T) {
	filestoretest.Run(t, func(t *testing.T) filestore.Store {
		s, err := Open(Config{Dir: filepath.Join(t.TempDir(), "files")})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, filestoretest.Features{LargeSize: 32 << 20, HeapBound: 8 << 20})
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Dir: "x", FileMode: 0o400, StaleTemp: 1}, "owner read and write"},
		{Config{Dir: "x", FileMode: os.ModeDir | 0o600, StaleTemp: 1}, "other than permissions"},
		{Config{Dir: "x", FileMode: 0o600, StaleTemp: -1}, "negative"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error with %q", c.cfg, err, c.want)
		}
	}
	var c Config
	c.SetDefaults()
	if err := c.Validate(); err != nil || c.Dir != "sluice-files" || c.FileMode != 0o640 || c.StaleTemp.D() != time.Hour {
		t.Fatalf("defaults %+v: %v", c, err)
	}
}

func TestFilesLandInDirWithMode(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, FileMode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), "file-a", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dir, "file-a"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", info.Mode())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries after one put, want 1 (no temporary left)", len(ents))
	}
}

func TestOpenRemovesStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, tempPrefix+"crashed")
	fresh := filepath.Join(dir, tempPrefix+"writing")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: dir, StaleTemp: config.Duration(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale temporary still there: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("fresh temporary removed: %v", err)
	}
}
