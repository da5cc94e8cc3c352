package gcs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/filestoretest"
)

// fake is fake-gcs-server's fakestorage served over real HTTP on
// 127.0.0.1, counting the requests the store sends and failing the next
// fail ones with 503.
type fake struct {
	gcs       *fakestorage.Server
	srv       *httptest.Server
	buckets   atomic.Int64
	media     atomic.Int64 // single-request uploads
	sessions  atomic.Int64 // resumable uploads started
	chunks    atomic.Int64 // chunks sent to a session
	cancelled atomic.Int64 // sessions deleted
	fail      atomic.Int64
}

func startFake(t *testing.T) *fake {
	t.Helper()
	gcs, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true})
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{gcs: gcs}
	h := gcs.HTTPHandler()
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.fail.Add(-1) >= 0 {
			http.Error(w, `{"error":{"code":503,"message":"try again"}}`, http.StatusServiceUnavailable)
			return
		}
		f.fail.Store(0)
		q := r.URL.Query()
		switch {
		case r.Method == http.MethodPost && q.Get("uploadType") == "media":
			f.media.Add(1)
		case r.Method == http.MethodPost && q.Get("uploadType") == "resumable" && !q.Has("upload_id"):
			f.sessions.Add(1)
		case r.Method == http.MethodPut && q.Has("upload_id"):
			f.chunks.Add(1)
		case r.Method == http.MethodDelete && q.Has("upload_id"):
			f.cancelled.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { f.srv.Close(); gcs.Stop() })
	return f
}

// store opens a Store on a fresh bucket of f.
func (f *fake) store(t *testing.T, chunk int) *Store {
	t.Helper()
	bucket := fmt.Sprintf("bucket-%d", f.buckets.Add(1))
	f.gcs.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
	s, err := Open(context.Background(), Config{Bucket: bucket, Prefix: "files/", Endpoint: f.srv.URL + "/storage/v1/", NoAuth: true, ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the suite against fake-gcs-server over real HTTP.
func TestConformance(t *testing.T) {
	f := startFake(t)
	// HeapBound stays 0: the fake keeps objects in this process's memory.
	filestoretest.Run(t, func(t *testing.T) filestore.Store { return f.store(t, 256<<10) },
		filestoretest.Features{LargeSize: 3<<20 + 12345})
	if f.sessions.Load() == 0 || f.chunks.Load() < 2 {
		t.Fatalf("%d resumable uploads, %d chunks: the large file did not go through the chunk loop", f.sessions.Load(), f.chunks.Load())
	}
}

func TestUploadShapes(t *testing.T) {
	f := startFake(t)
	s := f.store(t, 256<<10)
	ctx := context.Background()
	// Smaller than a chunk, and exactly one chunk: one media upload each.
	for i, size := range []int{1000, 256 << 10} {
		if _, err := s.Put(ctx, fmt.Sprintf("file-%d", i), bytes.NewReader(bytes.Repeat([]byte("x"), size))); err != nil {
			t.Fatal(err)
		}
	}
	if f.media.Load() != 2 || f.sessions.Load() != 0 {
		t.Fatalf("%d media uploads and %d sessions for two one-chunk files, want 2 and 0", f.media.Load(), f.sessions.Load())
	}
	// Two chunks and a byte: one session, three chunks, the object whole
	// under the prefix.
	data := bytes.Repeat([]byte("0123456789abcdef"), 2*(256<<10)/16+1)[:2*(256<<10)+1]
	if n, err := s.Put(ctx, "file-big", bytes.NewReader(data)); err != nil || n != int64(len(data)) {
		t.Fatalf("Put: %d, %v", n, err)
	}
	if f.sessions.Load() != 1 || f.chunks.Load() != 3 {
		t.Fatalf("%d sessions, %d chunks for 2 chunks and a byte, want 1 and 3", f.sessions.Load(), f.chunks.Load())
	}
	obj, err := f.gcs.GetObject(s.bucket, "files/file-big")
	if err != nil || !bytes.Equal(obj.Content, data) {
		t.Fatalf("object files/file-big: %v (%d bytes, want %d)", err, len(obj.Content), len(data))
	}
}

func TestFailedUploadCancelsSession(t *testing.T) {
	f := startFake(t)
	s := f.store(t, 256<<10)
	ctx := context.Background()
	if _, err := s.Put(ctx, "broken", filestoretest.FailingReader(600<<10)); err == nil || !strings.Contains(err.Error(), "source broke") {
		t.Fatalf("Put of a broken source: %v", err)
	}
	if f.sessions.Load() != 1 || f.cancelled.Load() != 1 {
		t.Fatalf("%d sessions started, %d cancelled, want 1 and 1", f.sessions.Load(), f.cancelled.Load())
	}
	if _, err := s.Stat(ctx, "broken"); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Stat after a failed Put: %v, want ErrNotFound", err)
	}
}

func TestTransientErrorsRetried(t *testing.T) {
	f := startFake(t)
	s := f.store(t, 256<<10)
	ctx := context.Background()
	f.fail.Store(2)
	if _, err := s.Put(ctx, "retried", strings.NewReader("hello")); err != nil {
		t.Fatalf("Put after two 503s: %v", err)
	}
	f.fail.Store(2)
	if info, err := s.Stat(ctx, "retried"); err != nil || info.Size != 5 {
		t.Fatalf("Stat after two 503s: %+v, %v", info, err)
	}
	f.fail.Store(100)
	_, err := s.Stat(ctx, "retried")
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "try again") {
		t.Fatalf("Stat through steady 503s: %v, want the 503 and its message", err)
	}
	if left := f.fail.Load(); left != 100-4 {
		t.Fatalf("%d attempts, want 4", 100-left)
	}
}

func TestEmulatorHostFromEnvironment(t *testing.T) {
	f := startFake(t)
	f.gcs.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "env-bucket"})
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(f.srv.URL, "http://"))
	s, err := Open(context.Background(), Config{Bucket: "env-bucket"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Put(context.Background(), "via-env", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.gcs.GetObject("env-bucket", "via-env"); err != nil {
		t.Fatalf("object via-env: %v", err)
	}
}

func TestOpenFromOffset(t *testing.T) {
	f := startFake(t)
	s := f.store(t, 256<<10)
	ctx := context.Background()
	if _, err := s.Put(ctx, "read", strings.NewReader("0123456789")); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Open(ctx, "read", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, err := io.ReadAll(rc); err != nil || string(b) != "456789" {
		t.Fatalf("read from 4: %q, %v", b, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ChunkSize: 256 << 10}, "bucket is empty"},
		{Config{Bucket: "b", ChunkSize: 1000}, "256 KiB"},
		{Config{Bucket: "b", ChunkSize: 256 << 10, NoAuth: true, CredentialsFile: "k.json"}, "exclude"},
		{Config{Bucket: "b", ChunkSize: 256 << 10, Endpoint: "localhost:4443"}, "not an http"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}
