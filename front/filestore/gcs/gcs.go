// Package gcs is the filestore backend for Google Cloud Storage, on
// cloud.google.com/go/storage.
//
// A Put streams through the library's resumable upload: the writer holds
// one chunk (ChunkSize) at a time, and GCS creates the object only when
// the upload is finalised, so a failed or cancelled Put (its context is
// cancelled, which aborts the upload) leaves no object under the id.
package gcs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/sluice-io/sluice/front/filestore"
)

// DefaultChunkSize is the upload chunk (and the buffer one Put holds).
const DefaultChunkSize = 16 << 20

// Config configures a GCS store.
type Config struct {
	// Bucket holds the files (required; it must exist).
	Bucket string `json:"bucket" yaml:"bucket"`
	// Prefix is prepended to every id to make its object name.
	Prefix string `json:"prefix,omitempty" yaml:"prefix,omitempty"`
	// Endpoint is the JSON API's base URL for an emulator (e.g.
	// "http://127.0.0.1:4443/storage/v1/"); "" for GCS itself. The library
	// also honours STORAGE_EMULATOR_HOST.
	Endpoint string `json:"endpoint,omitempty" yaml:"endpoint,omitempty"`
	// CredentialsFile is a service-account key file; "" uses Application
	// Default Credentials (workload identity, GOOGLE_APPLICATION_CREDENTIALS, …).
	CredentialsFile string `json:"credentials_file,omitempty" yaml:"credentials_file,omitempty"`
	// NoAuth sends no credentials (for an emulator).
	NoAuth bool `json:"no_auth,omitempty" yaml:"no_auth,omitempty"`
	// ChunkSize is the resumable upload's chunk, a multiple of 256 KiB.
	// Default 16 MiB.
	ChunkSize int `json:"chunk_size,omitempty" yaml:"chunk_size,omitempty"`
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
}

// Validate checks c (after SetDefaults).
func (c Config) Validate() error {
	if c.Bucket == "" {
		return errors.New("gcs filestore: bucket is empty")
	}
	if c.ChunkSize <= 0 || c.ChunkSize%(256<<10) != 0 {
		return fmt.Errorf("gcs filestore: chunk_size %d is not a positive multiple of 256 KiB", c.ChunkSize)
	}
	if c.NoAuth && c.CredentialsFile != "" {
		return errors.New("gcs filestore: no_auth and credentials_file exclude each other")
	}
	if c.Endpoint != "" && !strings.HasPrefix(c.Endpoint, "http://") && !strings.HasPrefix(c.Endpoint, "https://") {
		return fmt.Errorf("gcs filestore: endpoint %q is not an http(s) URL", c.Endpoint)
	}
	return nil
}

// Store keeps files as objects in one bucket. It is safe for concurrent use.
type Store struct {
	client *storage.Client
	bucket *storage.BucketHandle
	prefix string
	chunk  int
}

var (
	_ filestore.Store  = (*Store)(nil)
	_ filestore.Lister = (*Store)(nil)
)

// Open builds the client; it does not reach the store. Close releases it.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var opts []option.ClientOption
	if cfg.Endpoint != "" {
		// Reads through the JSON API too: an emulator serves it at Endpoint,
		// where the XML API's host is GCS's own.
		opts = append(opts, option.WithEndpoint(cfg.Endpoint), storage.WithJSONReads())
	}
	if cfg.NoAuth {
		opts = append(opts, option.WithoutAuthentication())
	}
	if cfg.CredentialsFile != "" {
		opts = append(opts, option.WithAuthCredentialsFile(option.ServiceAccount, cfg.CredentialsFile))
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcs filestore: %w", err)
	}
	return &Store{client: client, bucket: client.Bucket(cfg.Bucket), prefix: cfg.Prefix, chunk: cfg.ChunkSize}, nil
}

// Close releases the client.
func (s *Store) Close() error { return s.client.Close() }

func (s *Store) object(id string) (*storage.ObjectHandle, error) {
	if err := filestore.ValidateID(id); err != nil {
		return nil, err
	}
	return s.bucket.Object(s.prefix + id), nil
}

func wrap(op, id string, err error) error {
	if errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("%s %s: %w", op, id, filestore.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, id, err)
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
	obj, err := s.object(id)
	if err != nil {
		return 0, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := obj.NewWriter(wctx)
	w.ChunkSize = s.chunk
	w.ContentType = "application/octet-stream"
	n, err := io.Copy(w, ctxReader{ctx, r})
	if err != nil {
		cancel() // aborts the upload: no object is created
		w.Close()
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		cancel()
		w.Close()
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if err := w.Close(); err != nil {
		return 0, wrap("put", id, err)
	}
	return n, nil
}

// Open implements filestore.Store.
func (s *Store) Open(ctx context.Context, id string, offset int64) (io.ReadCloser, error) {
	obj, err := s.object(id)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("open %s: negative offset %d", id, offset)
	}
	rd, err := obj.NewRangeReader(ctx, offset, -1)
	var ge *googleapi.Error
	if err != nil && errors.As(err, &ge) && ge.Code == http.StatusRequestedRangeNotSatisfiable {
		info, serr := s.Stat(ctx, id)
		if serr != nil {
			return nil, serr
		}
		if offset == info.Size {
			return io.NopCloser(bytes.NewReader(nil)), nil
		}
		return nil, fmt.Errorf("open %s: offset %d is past its end (%d bytes)", id, offset, info.Size)
	}
	if err != nil {
		return nil, wrap("open", id, err)
	}
	if size := rd.Attrs.Size; offset > size {
		rd.Close()
		return nil, fmt.Errorf("open %s: offset %d is past its end (%d bytes)", id, offset, size)
	}
	return rd, nil
}

// Stat implements filestore.Store.
func (s *Store) Stat(ctx context.Context, id string) (filestore.Info, error) {
	obj, err := s.object(id)
	if err != nil {
		return filestore.Info{}, err
	}
	a, err := obj.Attrs(ctx)
	if err != nil {
		return filestore.Info{}, wrap("stat", id, err)
	}
	return filestore.Info{Size: a.Size, Written: a.Updated}, nil
}

// Delete implements filestore.Store.
func (s *Store) Delete(ctx context.Context, id string) error {
	obj, err := s.object(id)
	if err != nil {
		return err
	}
	if err := obj.Delete(ctx); err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return wrap("delete", id, err)
	}
	return nil
}

// List implements filestore.Lister: the objects under Prefix whose rest
// of name is a valid id.
func (s *Store) List(ctx context.Context, fn func(id string, info filestore.Info) error) error {
	it := s.bucket.Objects(ctx, &storage.Query{Prefix: s.prefix})
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", s.prefix, err)
		}
		id := strings.TrimPrefix(a.Name, s.prefix)
		if filestore.ValidateID(id) != nil {
			continue
		}
		if err := fn(id, filestore.Info{Size: a.Size, Written: a.Updated}); err != nil {
			return err
		}
	}
}
