package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	gcsstore "github.com/sluice-io/sluice/front/filestore/gcs"
	s3store "github.com/sluice-io/sluice/front/filestore/s3"
)

// batch_api.files reaches the stores whole: every key the config file
// sets is the store's.
func TestBatchFilesReachTheStores(t *testing.T) {
	f := config.BatchFiles{Bucket: "b", Prefix: "p/", Region: "eu-west-1", Endpoint: "http://127.0.0.1:9000", PathStyle: true,
		AccessKeyID: "AKID", SecretAccessKey: "shh", PartSize: 8 << 20, ChecksumWhenRequired: true,
		CredentialsFile: "/keys/sa.json", NoAuth: true, ChunkSize: 512 << 10, Dir: "files", StaleTemp: config.Duration(time.Minute)}
	if got, want := s3Files(f), (s3store.Config{Bucket: "b", Prefix: "p/", Region: "eu-west-1", Endpoint: "http://127.0.0.1:9000", PathStyle: true,
		AccessKeyID: "AKID", SecretAccessKey: "shh", PartSize: 8 << 20, ChecksumWhenRequired: true}); got != want {
		t.Errorf("s3:\n got %+v\nwant %+v", got, want)
	}
	if got, want := gcsFiles(f), (gcsstore.Config{Bucket: "b", Prefix: "p/", Endpoint: "http://127.0.0.1:9000",
		CredentialsFile: "/keys/sa.json", NoAuth: true, ChunkSize: 512 << 10}); got != want {
		t.Errorf("gcs:\n got %+v\nwant %+v", got, want)
	}
	if got := diskFiles(f); got.Dir != "files" || got.StaleTemp.D() != time.Minute {
		t.Errorf("disk: %+v", got)
	}
}

// The stores check their own keys: `sluice validate` (frontProblems)
// reports what the store's Validate refuses.
func TestBatchFilesCheckedByTheStore(t *testing.T) {
	tests := []struct {
		files config.BatchFiles
		want  string
	}{
		{config.BatchFiles{Store: "s3", Bucket: "b", PartSize: 1 << 20}, "batch_api.files: s3 filestore: part_size 1048576 is outside"},
		{config.BatchFiles{Store: "s3", Bucket: "b", AccessKeyID: "AKID"}, "batch_api.files: s3 filestore: access_key_id and secret_access_key are set together"},
		{config.BatchFiles{Store: "gcs", Bucket: "b", ChunkSize: 1000}, "batch_api.files: gcs filestore: chunk_size 1000 is not a positive multiple of 256 KiB"},
		{config.BatchFiles{Store: "gcs", Bucket: "b", NoAuth: true, CredentialsFile: "k.json"}, "batch_api.files: gcs filestore: no_auth and credentials_file exclude each other"},
		{config.BatchFiles{Store: "disk", Dir: "d", StaleTemp: config.Duration(-time.Second)}, "batch_api.files: disk filestore: stale_temp -1s is negative"},
		{config.BatchFiles{Store: "s3", Bucket: "b", PartSize: 8 << 20, AccessKeyID: "a", SecretAccessKey: "s"}, ""},
	}
	ad := registered(t)
	for _, tc := range tests {
		cfg := &config.Config{Transport: "memory", BatchAPI: config.BatchAPI{Enabled: true, Files: tc.files},
			TransportConfig: config.TransportConfig{Queues: []config.Queue{{Queue: transport.Queue{Name: "q"}}}}}
		err := frontProblems(cfg, ad)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.files, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", tc.files, err, tc.want)
		}
	}
}
