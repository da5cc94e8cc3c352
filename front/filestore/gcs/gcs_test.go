package gcs

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/filestoretest"
)

// TestConformance runs the suite against fake-gcs-server's fakestorage,
// listening on 127.0.0.1 over real HTTP, through the real storage client.
func TestConformance(t *testing.T) {
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Host: "127.0.0.1", Port: 0, Scheme: "http", Writer: nil})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	var n atomic.Int64
	// HeapBound stays 0: the fake keeps objects in this process's memory.
	filestoretest.Run(t, func(t *testing.T) filestore.Store {
		bucket := fmt.Sprintf("bucket-%d", n.Add(1))
		srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
		s, err := Open(context.Background(), Config{Bucket: bucket, Prefix: "files/", Endpoint: srv.URL() + "/storage/v1/", NoAuth: true, ChunkSize: 256 << 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, filestoretest.Features{LargeSize: 3<<20 + 12345})
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
