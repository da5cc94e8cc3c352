package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/filestore/disk"
	gcsstore "github.com/sluice-io/sluice/front/filestore/gcs"
	s3store "github.com/sluice-io/sluice/front/filestore/s3"
	"github.com/sluice-io/sluice/internal/configtypes"
)

// sectionsConfig is a valid config of one queue q with the fronts'
// sections batchAPI and openaiAPI ("" leaves one out), after set, with
// its defaults.
func sectionsConfig(batchAPI, openaiAPI string, set func(*config.Config)) *config.Config {
	c := &config.Config{TransportConfig: config.TransportConfig{ResultQueueName: "r",
		Queues: []config.Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}}}
	if batchAPI != "" {
		c.BatchAPI = json.RawMessage(batchAPI)
	}
	if openaiAPI != "" {
		c.OpenAIAPI = json.RawMessage(openaiAPI)
	}
	if set != nil {
		set(c)
	}
	c.SetDefaults()
	return c
}

// readFrontsDoc is readFronts of the config document doc, with its
// defaults.
func readFrontsDoc(t *testing.T, doc string) (frontConfig, error) {
	t.Helper()
	c, err := config.Parse([]byte(doc), "f.json")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	return readFronts(c, registered(t))
}

// The fronts' sections are checked as Config.Validate checked them before
// they moved to their components: the same cases, the same meanings (a
// rule a component holds is reported in its words).
func TestFrontSectionProblems(t *testing.T) {
	ad := registered(t)
	own := func(c *config.Config) { c.TransportConfig.Queues[0].ResultName = "own" }
	tests := []struct {
		name          string
		batch, openai string
		set           func(*config.Config)
		want          string
	}{
		{"batch_api off checks nothing", `{"state": {"store": "mongo"}}`, "", nil, ""},
		{"batch_api", `{"enabled": true}`, "", nil, ""},
		{"batch_api unknown queue", `{"enabled": true, "queue": "nope"}`, "", nil, `batch_api.queue: "nope" names no configured queue`},
		{"batch_api queue with its own results", `{"enabled": true}`, "", own, "batch_api.queue: queue q has its own result_queue_name"},
		{"batch_api transport", `{"enabled": true}`, "", func(c *config.Config) { c.Transport = "redis-pubsub" },
			"batch_api: needs a transport with a producer"},
		{"batch_api stores", `{"enabled": true, "files": {"store": "ftp"}, "state": {"store": "mongo"}}`, "", nil,
			`batch_api.files.store: "ftp": want disk, s3 or gcs`},
		{"batch_api state store", `{"enabled": true, "state": {"store": "mongo"}}`, "", nil, `batch_api.state.store: "mongo": want bolt or redis`},
		{"batch_api s3", `{"enabled": true, "files": {"store": "s3", "bucket": "b", "prefix": "p/", "region": "eu-west-1",
			"endpoint": "http://127.0.0.1:9000", "path_style": true}}`, "", nil, ""},
		{"batch_api gcs", `{"enabled": true, "files": {"store": "gcs", "bucket": "b", "prefix": "p/"}}`, "", nil, ""},
		{"batch_api s3 without bucket", `{"enabled": true, "files": {"store": "s3"}}`, "", nil, "batch_api.files: s3 filestore: bucket is empty"},
		{"batch_api gcs without bucket", `{"enabled": true, "files": {"store": "gcs"}}`, "", nil, "batch_api.files: gcs filestore: bucket is empty"},
		{"batch_api s3 with dir", `{"enabled": true, "files": {"store": "s3", "bucket": "b", "dir": "d"}}`, "", nil,
			"batch_api.files.dir: not a setting of the s3 store"},
		{"batch_api gcs with region", `{"enabled": true, "files": {"store": "gcs", "bucket": "b", "region": "r"}}`, "", nil,
			"batch_api.files.region: not a setting of the gcs store"},
		{"batch_api disk with bucket", `{"enabled": true, "files": {"bucket": "b"}}`, "", nil,
			"batch_api.files.bucket: not a setting of the disk store (its keys: dir, stale_temp)"},
		{"batch_api s3 endpoint", `{"enabled": true, "files": {"store": "s3", "bucket": "b", "endpoint": "minio:9000"}}`, "", nil,
			`batch_api.files: s3 filestore: endpoint "minio:9000" is not an http(s) URL`},
		{"batch_api gcs endpoint", `{"enabled": true, "files": {"store": "gcs", "bucket": "b", "endpoint": "minio:9000"}}`, "", nil,
			`batch_api.files: gcs filestore: endpoint "minio:9000" is not an http(s) URL`},
		{"openai_api off checks nothing", "", `{"default_queue": "nope"}`, nil, ""},
		{"openai_api", "", `{"enabled": true}`, nil, ""},
		{"openai_api with batch_api", `{"enabled": true}`, `{"enabled": true}`, nil, ""},
		{"openai_api same port as batch_api", `{"enabled": true}`, `{"enabled": true, "listen": "0.0.0.0:8090"}`, nil,
			"openai_api.listen: same port as batch_api.listen (8090)"},
		{"openai_api same port as metrics", "", `{"enabled": true, "listen": "127.0.0.1:9090"}`, nil,
			"openai_api.listen: same port as metrics_port (9090)"},
		{"openai_api listen", "", `{"enabled": true, "listen": "8091"}`, nil, `openai_api.listen: "8091" is not host:port`},
		{"openai_api unknown queue", "", `{"enabled": true, "default_queue": "nope"}`, nil, `openai_api.default_queue: "nope" names no configured queue`},
		{"openai_api unknown header queue", "", `{"enabled": true, "queues": ["q", "other"]}`, nil, `openai_api.queues[1]: "other" names no configured queue`},
		{"openai_api queue with its own results", "", `{"enabled": true}`, own, "openai_api.default_queue: queue q has its own result_queue_name"},
		{"openai_api transport", "", `{"enabled": true}`, func(c *config.Config) { c.Transport = "redis-pubsub" },
			"openai_api: needs a transport with a producer and per-request result routes (memory, redis-sortedset, redis-stream), not redis-pubsub"},
		{"batch_api redis state needs redis_url", `{"enabled": true, "state": {"store": "redis"}}`, "", nil, "batch_api.state.store: redis needs redis_url"},
		{"batch_api redis state on a transport url", `{"enabled": true, "state": {"store": "redis"}}`, "", func(c *config.Config) {
			c.Transport, c.TransportConfig.Options = "redis-sortedset", json.RawMessage(`{"url":"redis://127.0.0.1:6379/0"}`)
		}, ""},
		{"batch_api redis state prefix with a brace", `{"enabled": true, "state": {"store": "redis", "prefix": "s{x}:"}}`, "",
			func(c *config.Config) { c.RedisURL = "redis://127.0.0.1:6379/0" }, "batch_api.state.prefix: batch state: prefix \"s{x}:\": must not contain '{' or '}'"},
		{"batch_api listen", `{"enabled": true, "listen": "8090"}`, "", nil, `batch_api.listen: "8090" is not host:port`},
		{"batch_api window", `{"enabled": true, "completion_windows": ["1d"]}`, "", nil,
			`batch_api: batch: completion window "1d" is not a positive duration`},
		{"batch_api file expiry", `{"enabled": true, "file_expiry": "-1h"}`, "", nil, "batch_api: batch: file_expiry -1h0m0s is negative"},
		{"batch_api unknown key", `{"enabled": true, "route_prefx": "x:"}`, "", nil, `batch_api.route_prefx: unknown field (did you mean "route_prefix"?)`},
		{"batch_api unknown state key", `{"enabled": true, "state": {"pth": "x"}}`, "", nil, `batch_api.state.pth: unknown field (did you mean "path"?)`},
		{"batch_api unknown files key", `{"enabled": true, "files": {"dri": "x"}}`, "", nil, `batch_api.files.dri: unknown field (did you mean "dir"?)`},
		{"openai_api unknown key", "", `{"enabled": true, "keepalive": "5s"}`, nil, `openai_api.keepalive: unknown field (did you mean "keep_alive"?)`},
		{"openai_api its own check", "", `{"enabled": true, "default_timeout": "2h"}`, nil, "openai_api: default_timeout 2h0m0s is above max_timeout 1h0m0s"},
		{"batch_api not a duration", `{"enabled": true, "owner_lease": "soon"}`, "", nil, `batch_api: owner_lease: "soon" is not a duration`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := frontProblems(sectionsConfig(tc.batch, tc.openai, tc.set), ad)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("frontProblems: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("frontProblems: %v, want %q", err, tc.want)
			}
		})
	}
}

// Every key of the S3, GCS and disk stores is settable from a config
// file, under batch_api.files, and reaches the store's Config whole.
func TestBatchFilesEveryStoreKey(t *testing.T) {
	tests := []struct {
		doc  string
		want storeSection
	}{
		{`{"store": "s3", "bucket": "b", "prefix": "p/", "region": "eu-west-1", "endpoint": "http://127.0.0.1:9000", "path_style": true,
		   "access_key_id": "AKID", "secret_access_key": "shh", "part_size": 8388608, "checksum_when_required": true}`,
			storeSection{store: "s3", s3: s3store.Config{Bucket: "b", Prefix: "p/", Region: "eu-west-1", Endpoint: "http://127.0.0.1:9000", PathStyle: true,
				AccessKeyID: "AKID", SecretAccessKey: "shh", PartSize: 8 << 20, ChecksumWhenRequired: true}}},
		{`{"store": "gcs", "bucket": "b", "credentials_file": "/keys/sa.json", "chunk_size": 524288}`,
			storeSection{store: "gcs", gcs: gcsstore.Config{Bucket: "b", CredentialsFile: "/keys/sa.json", ChunkSize: 512 << 10}}},
		{`{"store": "gcs", "bucket": "b", "endpoint": "http://127.0.0.1:4443/storage/v1/", "no_auth": true}`,
			storeSection{store: "gcs", gcs: gcsstore.Config{Bucket: "b", Endpoint: "http://127.0.0.1:4443/storage/v1/", NoAuth: true,
				ChunkSize: gcsstore.DefaultChunkSize}}},
		{`{"store": "disk", "dir": "/var/lib/sluice/files", "stale_temp": "30m"}`,
			storeSection{store: "disk", disk: disk.Config{Dir: "/var/lib/sluice/files", FileMode: 0o640, StaleTemp: configtypes.Duration(30 * time.Minute)}}},
		{`{}`, storeSection{store: "disk", disk: disk.Config{Dir: "sluice-files", FileMode: 0o640, StaleTemp: configtypes.Duration(time.Hour)}}},
	}
	for _, tc := range tests {
		doc := `{"batch_api": {"enabled": true, "files": ` + tc.doc + `},
		  "transport_config": {"result_queue_name": "r", "queues": [{"queue_name": "q", "igw_base_url": "http://gw"}]}}`
		fc, err := readFrontsDoc(t, doc)
		if err != nil {
			t.Errorf("%s: %v", tc.doc, err)
			continue
		}
		if got := fc.batch.files; !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.doc, got, tc.want)
		}
	}
}

// A key of one store is refused on another, naming the store's keys.
func TestBatchFilesKeyOfAnotherStore(t *testing.T) {
	ad := registered(t)
	tests := []struct{ files, want string }{
		{`{"store": "gcs", "bucket": "b", "part_size": 8388608}`,
			"batch_api.files.part_size: not a setting of the gcs store (its keys: bucket, prefix, endpoint, credentials_file, no_auth, chunk_size)"},
		{`{"store": "gcs", "bucket": "b", "access_key_id": "a", "secret_access_key": "s"}`, "batch_api.files.secret_access_key: not a setting of the gcs store"},
		{`{"store": "s3", "bucket": "b", "no_auth": true}`, "batch_api.files.no_auth: not a setting of the s3 store"},
		{`{"store": "s3", "bucket": "b", "stale_temp": "1h"}`, "batch_api.files.stale_temp: not a setting of the s3 store"},
		{`{"store": "disk", "chunk_size": 1048576}`, "batch_api.files.chunk_size: not a setting of the disk store (its keys: dir, stale_temp)"},
		{`{"store": "disk", "credentials_file": "k.json"}`, "batch_api.files.credentials_file: not a setting of the disk store"},
	}
	for _, tc := range tests {
		err := frontProblems(sectionsConfig(`{"enabled": true, "files": `+tc.files+`}`, "", nil), ad)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.files, err, tc.want)
		}
	}
}

// The stores check their own keys: `sluice validate` (frontProblems)
// reports what the store's Validate refuses.
func TestBatchFilesCheckedByTheStore(t *testing.T) {
	tests := []struct{ files, want string }{
		{`{"store": "s3", "bucket": "b", "part_size": 1048576}`, "batch_api.files: s3 filestore: part_size 1048576 is outside"},
		{`{"store": "s3", "bucket": "b", "access_key_id": "AKID"}`, "batch_api.files: s3 filestore: access_key_id and secret_access_key are set together"},
		{`{"store": "gcs", "bucket": "b", "chunk_size": 1000}`, "batch_api.files: gcs filestore: chunk_size 1000 is not a positive multiple of 256 KiB"},
		{`{"store": "gcs", "bucket": "b", "no_auth": true, "credentials_file": "k.json"}`, "batch_api.files: gcs filestore: no_auth and credentials_file exclude each other"},
		{`{"store": "disk", "dir": "d", "stale_temp": "-1s"}`, "batch_api.files: disk filestore: stale_temp -1s is negative"},
		{`{"store": "s3", "bucket": "b", "part_size": 8388608, "access_key_id": "a", "secret_access_key": "s"}`, ""},
	}
	ad := registered(t)
	for _, tc := range tests {
		c := sectionsConfig(`{"enabled": true, "files": `+tc.files+`}`, "", func(c *config.Config) { c.Transport = "memory" })
		err := frontProblems(c, ad)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.files, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.files, err, tc.want)
		}
	}
}

// Every setting of front/batch is settable from the config file, under
// batch_api, and reaches the Service's Config; the queue is named by id
// and reaches it as its broker name.
func TestBatchAPIEveryFrontKey(t *testing.T) {
	doc := `{"batch_api": {"enabled": true, "queue": "jobs", "route_prefix": "b:", "owner": "replica-1", "owner_lease": "45s",
	    "max_file_bytes": 1048576, "max_lines": 500, "chunk_size": 50, "file_expiry": "48h", "cancel_quiet": 0.5,
	    "cancel_wait": "2m", "scan_interval": "250ms", "record_wait": "5ms", "completion_windows": ["1h", "24h"]},
	  "transport_config": {"result_queue_name": "r", "queues": [{"id": "jobs", "queue_name": "sluice:requests:jobs", "igw_base_url": "http://gw"}]}}`
	fc, err := readFrontsDoc(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	want := batch.Config{Queue: "sluice:requests:jobs", RoutePrefix: "b:", Owner: "replica-1", OwnerLease: 45 * time.Second,
		MaxFileBytes: 1 << 20, MaxLines: 500, ChunkSize: 50, FileExpiry: 48 * time.Hour, CancelQuiet: 500 * time.Millisecond,
		CancelWait: 2 * time.Minute, ScanInterval: 250 * time.Millisecond, RecordWait: 5 * time.Millisecond, Windows: []string{"1h", "24h"}}
	if got := fc.batch.front; !reflect.DeepEqual(got, want) {
		t.Errorf("batch_api:\n got %+v\nwant %+v", got, want)
	}
	if fc.batch.Listen != "127.0.0.1:8090" || fc.batch.State != (batchState{Store: "bolt", Path: "sluice-batch.db"}) {
		t.Errorf("the assembly's keys: listen %q, state %+v", fc.batch.Listen, fc.batch.State)
	}
}

// Every setting of front/openai is settable under openai_api and reaches
// the front's Config, the queues named by id reaching it as broker names.
func TestOpenAIAPIEveryFrontKey(t *testing.T) {
	doc := `{"openai_api": {"enabled": true, "listen": "127.0.0.1:9999", "default_queue": "a", "queues": ["a", "sluice:requests:b"],
	    "route_prefix": "o:", "default_timeout": "1m", "max_timeout": "10m", "result_grace": 3, "keep_alive": "5s",
	    "max_body_bytes": 1024, "forward_headers": ["X-Gateway-Model-Name"]},
	  "transport_config": {"result_queue_name": "r", "queues": [{"id": "a", "queue_name": "sluice:requests:a", "igw_base_url": "http://gw"},
	    {"id": "b", "queue_name": "sluice:requests:b", "igw_base_url": "http://gw"}]}}`
	fc, err := readFrontsDoc(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	got := fc.openai.Config
	if got.Listen != "127.0.0.1:9999" || got.DefaultQueue != "sluice:requests:a" ||
		!reflect.DeepEqual(got.Queues, []string{"sluice:requests:a", "sluice:requests:b"}) || got.RoutePrefix != "o:" ||
		got.DefaultTimeout.D() != time.Minute || got.MaxTimeout.D() != 10*time.Minute || got.ResultGrace.D() != 3*time.Second ||
		got.KeepAlive.D() != 5*time.Second || got.MaxBodyBytes != 1024 || !reflect.DeepEqual(got.ForwardHeaders, []string{"X-Gateway-Model-Name"}) {
		t.Errorf("openai_api: %+v", got)
	}
}
