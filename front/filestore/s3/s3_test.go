package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/filestoretest"
)

// fake is gofakes3 served over real HTTP on 127.0.0.1, counting the
// multipart uploads it completes and aborts, and failing the next fail
// requests with 503.
type fake struct {
	backend   *s3mem.Backend
	srv       *httptest.Server
	completes atomic.Int64
	aborts    atomic.Int64
	buckets   atomic.Int64
	fail      atomic.Int64
	lastAuth  atomic.Value // the Authorization header of the last request
}

func startFake(t *testing.T) *fake {
	f := &fake{backend: s3mem.New()}
	h := gofakes3.New(f.backend).Server()
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.lastAuth.Store(r.Header.Get("Authorization"))
		if f.fail.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `<Error><Code>SlowDown</Code><Message>try again</Message></Error>`)
			return
		}
		f.fail.Store(0)
		if r.Method == http.MethodPost && r.URL.Query().Has("uploadId") {
			f.completes.Add(1)
		}
		if r.Method == http.MethodDelete && r.URL.Query().Has("uploadId") {
			f.aborts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// store opens a Store on a fresh bucket of f.
func (f *fake) store(t *testing.T, prefix string) *Store {
	t.Helper()
	bucket := fmt.Sprintf("bucket-%d", f.buckets.Add(1))
	s, err := Open(context.Background(), Config{
		Bucket: bucket, Prefix: prefix, Region: "us-east-1", Endpoint: f.srv.URL, PathStyle: true,
		AccessKeyID: "test", SecretAccessKey: "test", PartSize: MinPartSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.backend.CreateBucket(bucket); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	f := startFake(t)
	// HeapBound stays 0: gofakes3 keeps objects (and multipart parts) in
	// this process's memory, so the heap would measure the fake. A Put
	// holds one part buffer (PartSize) by construction.
	filestoretest.Run(t, func(t *testing.T) filestore.Store { return f.store(t, "files/") },
		filestoretest.Features{LargeSize: 2*MinPartSize + 12345})
	if f.completes.Load() == 0 {
		t.Fatal("no multipart upload was completed: the large file did not go through the part loop")
	}
}

func TestMultipartPartsAndPrefix(t *testing.T) {
	f := startFake(t)
	s := f.store(t, "pre/")
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789"), MinPartSize/10+7)
	n, err := s.Put(ctx, "file-mp", bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("Put: %d, %v", n, err)
	}
	if f.completes.Load() != 1 {
		t.Fatalf("%d multipart completions for a %d-byte file, want 1", f.completes.Load(), len(data))
	}
	// The object lies under the prefix, whole.
	obj, err := f.backend.GetObject(s.bucket, "pre/file-mp", nil)
	if err != nil {
		t.Fatalf("object pre/file-mp: %v", err)
	}
	got, _ := io.ReadAll(obj.Contents)
	obj.Contents.Close()
	if !bytes.Equal(got, data) {
		t.Fatalf("object pre/file-mp holds %d bytes, want the %d put", len(got), len(data))
	}
	// A file of exactly one part goes as one PutObject.
	if _, err := s.Put(ctx, "file-one", bytes.NewReader(data[:MinPartSize-1])); err != nil {
		t.Fatal(err)
	}
	if f.completes.Load() != 1 {
		t.Fatal("a file smaller than a part went through a multipart upload")
	}
}

func TestFailedUploadAborts(t *testing.T) {
	f := startFake(t)
	s := f.store(t, "")
	ctx := context.Background()
	if _, err := s.Put(ctx, "broken", filestoretest.FailingReader(MinPartSize+1000)); err == nil || !strings.Contains(err.Error(), "source broke") {
		t.Fatalf("Put of a broken source: %v", err)
	}
	if f.aborts.Load() != 1 || f.completes.Load() != 0 {
		t.Fatalf("%d aborts, %d completions, want 1 and 0", f.aborts.Load(), f.completes.Load())
	}
	if _, err := s.Stat(ctx, "broken"); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Stat after a failed Put: %v, want ErrNotFound", err)
	}
}

func TestTransientErrorsRetried(t *testing.T) {
	f := startFake(t)
	s := f.store(t, "")
	ctx := context.Background()
	f.fail.Store(2)
	if _, err := s.Put(ctx, "retried", strings.NewReader("hello")); err != nil {
		t.Fatalf("Put after two 503s: %v", err)
	}
	f.fail.Store(100)
	_, err := s.Open(ctx, "retried", 0)
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "SlowDown: try again") {
		t.Fatalf("Open through steady 503s: %v, want the 503 and S3's message", err)
	}
	if left := f.fail.Load(); left != 100-4 {
		t.Fatalf("%d attempts, want 4", 100-left)
	}
}

// TestCredentialChain: without static keys the store signs with the
// environment's, else the shared credentials file's profile.
func TestCredentialChain(t *testing.T) {
	f := startFake(t)
	if err := f.backend.CreateBucket("chain"); err != nil {
		t.Fatal(err)
	}
	open := func() *Store {
		s, err := Open(context.Background(), Config{Bucket: "chain", Endpoint: f.srv.URL, PathStyle: true, Region: "eu-west-3"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "")
	t.Setenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "")
	t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "")
	file := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(file, []byte("[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s1\n\n[ci]\naws_access_key_id=AKCI\naws_secret_access_key=s2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	t.Setenv("AWS_PROFILE", "ci")
	if _, err := open().Put(context.Background(), "a", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if auth := f.lastAuth.Load().(string); !strings.Contains(auth, "Credential=AKCI/") || !strings.Contains(auth, "/eu-west-3/s3/aws4_request") {
		t.Fatalf("Authorization %q: not profile ci's key in eu-west-3", auth)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s3")
	if _, err := open().Put(context.Background(), "b", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if auth := f.lastAuth.Load().(string); !strings.Contains(auth, "Credential=AKENV/") {
		t.Fatalf("Authorization %q: not the environment's key", auth)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	_, err := open().Put(context.Background(), "c", strings.NewReader("x"))
	if err == nil || !strings.Contains(err.Error(), "no AWS credentials") {
		t.Fatalf("Put without credentials: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "bucket is empty"},
		{Config{Bucket: "b", PartSize: 1 << 20}, "part_size"},
		{Config{Bucket: "b", PartSize: MinPartSize, AccessKeyID: "x"}, "together"},
		{Config{Bucket: "b", PartSize: MinPartSize, Endpoint: "localhost:9000"}, "not an http"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	var c Config
	c.Bucket = "b"
	c.SetDefaults()
	if err := c.Validate(); err != nil || c.PartSize != DefaultPartSize {
		t.Fatalf("defaults %+v: %v", c, err)
	}
}
