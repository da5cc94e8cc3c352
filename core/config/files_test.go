package config

import (
	"strings"
	"testing"
	"time"
)

// Every key of the S3, GCS and disk stores is settable from a config
// file, under batch_api.files.
func TestBatchFilesEveryStoreKey(t *testing.T) {
	tests := []struct {
		doc  string
		want BatchFiles
	}{
		{`{"store": "s3", "bucket": "b", "prefix": "p/", "region": "eu-west-1", "endpoint": "http://127.0.0.1:9000", "path_style": true,
		   "access_key_id": "AKID", "secret_access_key": "shh", "part_size": 8388608, "checksum_when_required": true}`,
			BatchFiles{Store: "s3", Bucket: "b", Prefix: "p/", Region: "eu-west-1", Endpoint: "http://127.0.0.1:9000", PathStyle: true,
				AccessKeyID: "AKID", SecretAccessKey: "shh", PartSize: 8 << 20, ChecksumWhenRequired: true}},
		{`{"store": "gcs", "bucket": "b", "credentials_file": "/keys/sa.json", "chunk_size": 524288}`,
			BatchFiles{Store: "gcs", Bucket: "b", CredentialsFile: "/keys/sa.json", ChunkSize: 512 << 10}},
		{`{"store": "gcs", "bucket": "b", "endpoint": "http://127.0.0.1:4443/storage/v1/", "no_auth": true}`,
			BatchFiles{Store: "gcs", Bucket: "b", Endpoint: "http://127.0.0.1:4443/storage/v1/", NoAuth: true}},
		{`{"store": "disk", "dir": "/var/lib/sluice/files", "stale_temp": "30m"}`,
			BatchFiles{Store: "disk", Dir: "/var/lib/sluice/files", StaleTemp: Duration(30 * time.Minute)}},
	}
	for _, tc := range tests {
		doc := `{"batch_api": {"enabled": true, "files": ` + tc.doc + `},
		  "transport_config": {"result_queue_name": "r", "queues": [{"queue_name": "q", "igw_base_url": "http://gw"}]}}`
		c, err := Parse([]byte(doc), "f.json")
		if err != nil {
			t.Errorf("%s: %v", tc.doc, err)
			continue
		}
		if c.BatchAPI.Files != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.doc, c.BatchAPI.Files, tc.want)
		}
		c.SetDefaults()
		if err := c.Validate(known()); err != nil {
			t.Errorf("%s: Validate: %v", tc.doc, err)
		}
	}
}

// A key of one store is refused on another, naming the store's keys.
func TestBatchFilesKeyOfAnotherStore(t *testing.T) {
	tests := []struct {
		files BatchFiles
		want  string
	}{
		{BatchFiles{Store: "gcs", Bucket: "b", PartSize: 8 << 20}, "batch_api.files.part_size: not a setting of the gcs store (its keys: bucket, prefix, endpoint, credentials_file, no_auth, chunk_size)"},
		{BatchFiles{Store: "gcs", Bucket: "b", AccessKeyID: "a", SecretAccessKey: "s"}, "batch_api.files.secret_access_key: not a setting of the gcs store"},
		{BatchFiles{Store: "s3", Bucket: "b", NoAuth: true}, "batch_api.files.no_auth: not a setting of the s3 store"},
		{BatchFiles{Store: "s3", Bucket: "b", StaleTemp: Duration(time.Hour)}, "batch_api.files.stale_temp: not a setting of the s3 store"},
		{BatchFiles{Store: "disk", ChunkSize: 1 << 20}, "batch_api.files.chunk_size: not a setting of the disk store (its keys: dir, stale_temp)"},
		{BatchFiles{Store: "disk", CredentialsFile: "k.json"}, "batch_api.files.credentials_file: not a setting of the disk store"},
	}
	for _, tc := range tests {
		c := &Config{TransportConfig: TransportConfig{ResultQueueName: "r", Queues: []Queue{{IGWBaseURL: "http://gw"}}}}
		c.TransportConfig.Queues[0].Name = "q"
		c.BatchAPI.Enabled, c.BatchAPI.Files = true, tc.files
		c.SetDefaults()
		if err := c.Validate(known()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.files, err, tc.want)
		}
	}
}
