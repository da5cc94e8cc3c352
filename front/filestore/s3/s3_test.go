package s3

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/filestoretest"
)

// fake is gofakes3 served over real HTTP on 127.0.0.1, counting the
// multipart uploads it completes.
type fake struct {
	srv       *httptest.Server
	completes atomic.Int64
	buckets   atomic.Int64
}

func startFake(t *testing.T) *fake {
	f := &fake{}
	h := gofakes3.New(s3mem.New()).Server()
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Query().Has("uploadId") {
			f.completes.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// store opens a Store on a fresh bucket of f.
func (f *fake) store(t *testing.T, prefix string) *Store {
	t.Helper()
	ctx := context.Background()
	bucket := fmt.Sprintf("bucket-%d", f.buckets.Add(1))
	s, err := Open(ctx, Config{
		Bucket: bucket, Prefix: prefix, Region: "us-east-1", Endpoint: f.srv.URL, PathStyle: true,
		AccessKeyID: "test", SecretAccessKey: "test", PartSize: MinPartSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
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
	out, err := s.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: strPtr("pre/file-mp")})
	if err != nil || *out.ContentLength != int64(len(data)) {
		t.Fatalf("HeadObject pre/file-mp: %v", err)
	}
	// A file of exactly one part goes as one PutObject.
	if _, err := s.Put(ctx, "file-one", bytes.NewReader(data[:MinPartSize-1])); err != nil {
		t.Fatal(err)
	}
	if f.completes.Load() != 1 {
		t.Fatal("a file smaller than a part went through a multipart upload")
	}
}

func strPtr(s string) *string { return &s }

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
