// Package disk is the default filestore backend: one directory, one file
// per id. A Put writes a temporary file in the same directory, fsyncs it,
// renames it over the id and fsyncs the directory, so a crash at any point
// leaves either the old file or the new one under the id, never a half
// file; temporaries a crash left behind are removed when the store opens.
package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/internal/configtypes"
)

// tempPrefix starts every temporary file's name; filestore ids never start
// with '.', so no id can name one.
const tempPrefix = ".put-"

// Config configures a disk store.
type Config struct {
	// Dir is the directory files live in; it is created (with parents)
	// when missing. Default "sluice-files" (relative to the working
	// directory).
	Dir string `json:"dir" yaml:"dir"`
	// FileMode is the permission of stored files. Default 0o640. Not a
	// config key (JSON has no octal); embedders set it in code.
	FileMode fs.FileMode `json:"-" yaml:"-"`
	// StaleTemp is how old a leftover temporary file must be before Open
	// removes it (younger ones may belong to another process writing to
	// the same directory). Default 1h.
	StaleTemp configtypes.Duration `json:"stale_temp,omitempty" yaml:"stale_temp,omitempty"`
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.Dir == "" {
		c.Dir = "sluice-files"
	}
	if c.FileMode == 0 {
		c.FileMode = 0o640
	}
	if c.StaleTemp == 0 {
		c.StaleTemp = configtypes.Duration(time.Hour)
	}
}

// Validate checks c (after SetDefaults).
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("disk filestore: dir is empty")
	}
	if c.FileMode&^fs.ModePerm != 0 {
		return fmt.Errorf("disk filestore: file_mode %o has bits other than permissions", c.FileMode)
	}
	if c.FileMode&0o600 != 0o600 {
		return fmt.Errorf("disk filestore: file_mode %o must let the owner read and write", c.FileMode)
	}
	if c.StaleTemp < 0 {
		return fmt.Errorf("disk filestore: stale_temp %v is negative", c.StaleTemp.D())
	}
	return nil
}

// Store is a directory of files. It is safe for concurrent use, also by
// several processes sharing the directory (a rename is atomic).
type Store struct {
	dir  string
	mode fs.FileMode
}

var (
	_ filestore.Store  = (*Store)(nil)
	_ filestore.Lister = (*Store)(nil)
)

// Open creates the directory if needed, removes stale temporaries and
// returns the store.
func Open(cfg Config) (*Store, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("disk filestore: %w", err)
	}
	s := &Store{dir: cfg.Dir, mode: cfg.FileMode}
	if err := s.removeStale(cfg.StaleTemp.D()); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the directory the store keeps its files in.
func (s *Store) Dir() string { return s.dir }

func (s *Store) removeStale(age time.Duration) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("disk filestore: %w", err)
	}
	cutoff := time.Now().Add(-age)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tempPrefix) {
			continue
		}
		info, err := e.Info()
		if err != nil || info.ModTime().After(cutoff) {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("disk filestore: remove stale temporary: %w", err)
		}
	}
	return nil
}

func (s *Store) path(id string) (string, error) {
	if err := filestore.ValidateID(id); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, id), nil
}

// ctxReader fails a copy once its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Put implements filestore.Store.
func (s *Store) Put(ctx context.Context, id string, r io.Reader) (int64, error) {
	final, err := s.path(id)
	if err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(s.dir, tempPrefix+"*")
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// io.Copy into an *os.File streams through a small buffer; the reader
	// is wrapped so a cancelled context stops the copy.
	n, err := io.Copy(tmp, ctxReader{ctx, r})
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if err := tmp.Chmod(s.mode); err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if err := tmp.Sync(); err != nil {
		return 0, fmt.Errorf("put %s: fsync: %w", id, err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	committed = true
	if err := syncDir(s.dir); err != nil {
		return n, fmt.Errorf("put %s: fsync directory: %w", id, err)
	}
	return n, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func notFound(id string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", id, filestore.ErrNotFound)
	}
	return fmt.Errorf("%s: %w", id, err)
}

// Open implements filestore.Store.
func (s *Store) Open(ctx context.Context, id string, offset int64) (io.ReadCloser, error) {
	p, err := s.path(id)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("open %s: negative offset %d", id, offset)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("open %w", notFound(id, err))
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", id, err)
	}
	if offset > info.Size() {
		f.Close()
		return nil, fmt.Errorf("open %s: offset %d is past its end (%d bytes)", id, offset, info.Size())
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", id, err)
	}
	return f, nil
}

// Stat implements filestore.Store.
func (s *Store) Stat(ctx context.Context, id string) (filestore.Info, error) {
	p, err := s.path(id)
	if err != nil {
		return filestore.Info{}, err
	}
	info, err := os.Stat(p)
	if err != nil {
		return filestore.Info{}, fmt.Errorf("stat %w", notFound(id, err))
	}
	return filestore.Info{Size: info.Size(), Written: info.ModTime()}, nil
}

// Delete implements filestore.Store.
func (s *Store) Delete(ctx context.Context, id string) error {
	p, err := s.path(id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

// List implements filestore.Lister; it skips temporaries and any entry
// whose name is not a valid id (a file someone else put in the directory).
func (s *Store) List(ctx context.Context, fn func(id string, info filestore.Info) error) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", s.dir, err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !e.Type().IsRegular() || filestore.ValidateID(e.Name()) != nil {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since ReadDir
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", s.dir, err)
		}
		if err := fn(e.Name(), filestore.Info{Size: info.Size(), Written: info.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}
