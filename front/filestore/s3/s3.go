// Package s3 is the filestore backend for Amazon S3 and S3-compatible
// stores (MinIO, Ceph RGW, R2, …), on S3's REST API over net/http with
// Signature Version 4 (sigv4.go) and AWS's usual credential chain
// (creds.go). The eight calls it makes do not need the AWS SDK, which
// cost about 8 MB of a release build.
//
// A Put streams: it reads the source one part at a time (PartSize bytes,
// one buffer per Put) and sends a file that fits in one part as a single
// PutObject, a larger one as a multipart upload, which S3 publishes under
// its key only when CompleteMultipartUpload succeeds; a failed or
// cancelled Put aborts the upload, so no partial object is ever visible
// under a final id. Sequential parts keep the memory of one Put at
// exactly one part. Every payload is signed with its SHA-256, which S3
// checks.
package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/internal/objhttp"
)

// Part sizes S3 allows: every part but the last at least MinPartSize, none
// above MaxPartSize.
const (
	MinPartSize     = 5 << 20
	MaxPartSize     = 5 << 30
	DefaultPartSize = 16 << 20
	maxParts        = 10000
)

// Config configures an S3 store.
type Config struct {
	// Bucket holds the files (required; it must exist).
	Bucket string `json:"bucket" yaml:"bucket"`
	// Prefix is prepended to every id to make its key (e.g. "sluice/files/").
	Prefix string `json:"prefix,omitempty" yaml:"prefix,omitempty"`
	// Region is the bucket's region. Default: AWS_REGION, else
	// AWS_DEFAULT_REGION, else the profile's region in ~/.aws/config, else
	// us-east-1.
	Region string `json:"region,omitempty" yaml:"region,omitempty"`
	// Endpoint is the URL of an S3-compatible store ("" for AWS S3).
	Endpoint string `json:"endpoint,omitempty" yaml:"endpoint,omitempty"`
	// PathStyle addresses buckets as endpoint/bucket/key rather than
	// bucket.endpoint/key (most S3-compatible stores want it).
	PathStyle bool `json:"path_style,omitempty" yaml:"path_style,omitempty"`
	// AccessKeyID and SecretAccessKey, when both set, are static
	// credentials; otherwise AWS's usual chain is used: the environment
	// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the
	// shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
	// ~/.aws/credentials, profile AWS_PROFILE), web identity
	// (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, as on EKS), the
	// container endpoint (ECS, EKS Pod Identity), the EC2 instance role.
	AccessKeyID     string `json:"access_key_id,omitempty" yaml:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty" yaml:"secret_access_key,omitempty"`
	// PartSize is the size of each uploaded part and of the one buffer a
	// Put holds. Default 16 MiB; 5 MiB to 5 GiB. A file is at most 10,000
	// parts (160 GiB at the default).
	PartSize int64 `json:"part_size,omitempty" yaml:"part_size,omitempty"`
	// ChecksumWhenRequired is kept for the configs that set it: the store
	// sends no optional checksum header any more (every payload is signed
	// with its SHA-256, which every S3-compatible store accepts), so it
	// changes nothing.
	ChecksumWhenRequired bool `json:"checksum_when_required,omitempty" yaml:"checksum_when_required,omitempty"`
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.PartSize == 0 {
		c.PartSize = DefaultPartSize
	}
}

// Validate checks c (after SetDefaults).
func (c Config) Validate() error {
	if c.Bucket == "" {
		return errors.New("s3 filestore: bucket is empty")
	}
	if c.PartSize < MinPartSize || c.PartSize > MaxPartSize {
		return fmt.Errorf("s3 filestore: part_size %d is outside [%d, %d]", c.PartSize, MinPartSize, MaxPartSize)
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return errors.New("s3 filestore: access_key_id and secret_access_key are set together or not at all")
	}
	if c.Endpoint != "" && !strings.HasPrefix(c.Endpoint, "http://") && !strings.HasPrefix(c.Endpoint, "https://") {
		return fmt.Errorf("s3 filestore: endpoint %q is not an http(s) URL", c.Endpoint)
	}
	return nil
}

// Store keeps files as objects in one bucket. It is safe for concurrent use.
type Store struct {
	hc        *http.Client
	creds     *credSource
	region    string
	scheme    string
	host      string // the endpoint's host, with the bucket first unless pathStyle
	basePath  string // the endpoint's path, escaped, without a final '/'
	pathStyle bool
	bucket    string
	prefix    string
	partSize  int64
}

var (
	_ filestore.Store  = (*Store)(nil)
	_ filestore.Lister = (*Store)(nil)
)

// Open builds the client. It does not reach the store.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	region := cfg.Region
	for _, r := range []func() string{
		func() string { return os.Getenv("AWS_REGION") },
		func() string { return os.Getenv("AWS_DEFAULT_REGION") },
		configRegion,
		func() string { return "us-east-1" },
	} {
		if region == "" {
			region = r()
		}
	}
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = "https://s3." + region + ".amazonaws.com"
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("s3 filestore: endpoint: %w", err)
	}
	hc := &http.Client{}
	s := &Store{
		hc: hc, creds: &credSource{hc: hc, region: region}, region: region,
		scheme: u.Scheme, host: u.Host, basePath: strings.TrimSuffix(u.EscapedPath(), "/"),
		pathStyle: cfg.PathStyle, bucket: cfg.Bucket, prefix: cfg.Prefix, partSize: cfg.PartSize,
	}
	if !s.pathStyle {
		s.host = cfg.Bucket + "." + u.Host
	}
	if cfg.AccessKeyID != "" {
		s.creds.static = &creds{AccessKeyID: cfg.AccessKeyID, SecretAccessKey: cfg.SecretAccessKey}
	}
	return s, nil
}

// Close releases the client's idle connections.
func (s *Store) Close() error {
	s.hc.CloseIdleConnections()
	return nil
}

func (s *Store) key(id string) (string, error) {
	if err := filestore.ValidateID(id); err != nil {
		return "", err
	}
	return s.prefix + id, nil
}

func wrap(op, id string, err error) error {
	if objhttp.IsStatus(err, http.StatusNotFound) {
		return fmt.Errorf("%s %s: %w", op, id, filestore.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, id, err)
}

// errorMessage reads S3's XML error body ("" for a HEAD's empty one).
func errorMessage(_ int, body []byte) string {
	var e struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	if xml.Unmarshal(body, &e) == nil && e.Code != "" {
		return e.Code + ": " + e.Message
	}
	return strings.TrimSpace(string(body))
}

// request is one S3 call: on the bucket (key "") or an object.
type request struct {
	method string
	key    string
	query  url.Values
	header map[string]string
	body   []byte
	ok     []int
}

// do signs and sends r (again on a transient failure) and returns the
// response when its status is one of r.ok.
func (s *Store) do(ctx context.Context, r request) (*http.Response, error) {
	path := s.basePath + "/"
	if s.pathStyle {
		path += escapePath(s.bucket)
		if r.key != "" {
			path += "/"
		}
	}
	path += escapePath(r.key)
	hash := emptySHA256
	if r.body != nil {
		sum := sha256.Sum256(r.body)
		hash = hex.EncodeToString(sum[:])
	}
	return objhttp.Do(ctx, s.hc, func() (*http.Request, error) {
		c, err := s.creds.get(ctx)
		if err != nil {
			return nil, err
		}
		u := &url.URL{Scheme: s.scheme, Host: s.host, RawQuery: strings.ReplaceAll(r.query.Encode(), "+", "%20")}
		u.Path, _ = url.PathUnescape(path)
		u.RawPath = path
		var body io.Reader
		if r.body != nil {
			body = bytes.NewReader(r.body)
		}
		req, err := http.NewRequestWithContext(ctx, r.method, u.String(), body)
		if err != nil {
			return nil, err
		}
		for k, v := range r.header {
			req.Header.Set(k, v)
		}
		sign(req, c, s.region, hash, time.Now())
		return req, nil
	}, errorMessage, r.ok...)
}

// fill reads the next part of r into buf (reset first); full says whether
// the part is PartSize long (so more may follow).
func (s *Store) fill(buf *bytes.Buffer, r io.Reader) (full bool, err error) {
	buf.Reset()
	n, err := io.CopyN(buf, r, s.partSize)
	if err == io.EOF {
		return false, nil
	}
	return n == s.partSize, err
}

func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
}

// Put implements filestore.Store.
func (s *Store) Put(ctx context.Context, id string, r io.Reader) (int64, error) {
	key, err := s.key(id)
	if err != nil {
		return 0, err
	}
	r = objhttp.CtxReader{Ctx: ctx, R: r}
	var buf bytes.Buffer
	full, err := s.fill(&buf, r)
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if !full {
		resp, err := s.do(ctx, request{method: http.MethodPut, key: key, body: buf.Bytes(), ok: []int{http.StatusOK},
			header: map[string]string{"Content-Type": "application/octet-stream"}})
		if err != nil {
			return 0, wrap("put", id, err)
		}
		drain(resp)
		return int64(buf.Len()), nil
	}
	uploadID, err := s.createUpload(ctx, key)
	if err != nil {
		return 0, wrap("put", id, err)
	}
	n, err := s.uploadParts(ctx, key, uploadID, &buf, r)
	if err != nil {
		// Abort even when ctx is done, so the store drops the parts.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		resp, aerr := s.do(actx, request{method: http.MethodDelete, key: key, query: url.Values{"uploadId": {uploadID}}, ok: []int{http.StatusNoContent, http.StatusOK}})
		if aerr != nil {
			err = errors.Join(err, fmt.Errorf("abort upload: %w", aerr))
		} else {
			drain(resp)
		}
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	return n, nil
}

// readXML decodes resp's XML body into v and closes it.
func readXML(resp *http.Response, v any) error {
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := xml.Unmarshal(body, v); err != nil {
		return fmt.Errorf("the answer is not the XML expected: %w", err)
	}
	return nil
}

// createUpload starts a multipart upload of key and returns its id.
func (s *Store) createUpload(ctx context.Context, key string) (string, error) {
	resp, err := s.do(ctx, request{method: http.MethodPost, key: key, query: url.Values{"uploads": {""}}, ok: []int{http.StatusOK},
		header: map[string]string{"Content-Type": "application/octet-stream"}})
	if err != nil {
		return "", err
	}
	var out struct {
		UploadID string `xml:"UploadId"`
	}
	if err := readXML(resp, &out); err != nil {
		return "", err
	}
	if out.UploadID == "" {
		return "", errors.New("CreateMultipartUpload: no upload id in the answer")
	}
	return out.UploadID, nil
}

// completedPart is one <Part> of CompleteMultipartUpload.
type completedPart struct {
	PartNumber int    `xml:"PartNumber"`
	ETag       string `xml:"ETag"`
}

// uploadParts sends buf (a full first part) and the rest of r as parts of
// upload id, then completes it.
func (s *Store) uploadParts(ctx context.Context, key, uploadID string, buf *bytes.Buffer, r io.Reader) (int64, error) {
	var parts []completedPart
	var total int64
	full := true
	for num := 1; buf.Len() > 0; num++ {
		if num > maxParts {
			return 0, fmt.Errorf("more than %d parts of %d bytes", maxParts, s.partSize)
		}
		size := int64(buf.Len())
		resp, err := s.do(ctx, request{method: http.MethodPut, key: key, body: buf.Bytes(), ok: []int{http.StatusOK},
			query: url.Values{"partNumber": {strconv.Itoa(num)}, "uploadId": {uploadID}}})
		if err != nil {
			return 0, fmt.Errorf("part %d: %w", num, err)
		}
		drain(resp)
		etag := resp.Header.Get("ETag")
		if etag == "" {
			return 0, fmt.Errorf("part %d: no ETag in the answer", num)
		}
		parts = append(parts, completedPart{PartNumber: num, ETag: etag})
		total += size
		if !full {
			break // that short part was the last
		}
		if full, err = s.fill(buf, r); err != nil {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	doc, err := xml.Marshal(struct {
		XMLName xml.Name        `xml:"http://s3.amazonaws.com/doc/2006-03-01/ CompleteMultipartUpload"`
		Parts   []completedPart `xml:"Part"`
	}{Parts: parts})
	if err != nil {
		return 0, err
	}
	resp, err := s.do(ctx, request{method: http.MethodPost, key: key, query: url.Values{"uploadId": {uploadID}}, body: doc, ok: []int{http.StatusOK},
		header: map[string]string{"Content-Type": "application/xml"}})
	if err != nil {
		return 0, fmt.Errorf("complete: %w", err)
	}
	// S3 may answer 200 and fail the completion in the body.
	var out struct {
		XMLName xml.Name
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	if err := readXML(resp, &out); err != nil {
		return 0, fmt.Errorf("complete: %w", err)
	}
	if out.XMLName.Local == "Error" {
		return 0, fmt.Errorf("complete: %s: %s", out.Code, out.Message)
	}
	return total, nil
}

// Open implements filestore.Store.
func (s *Store) Open(ctx context.Context, id string, offset int64) (io.ReadCloser, error) {
	key, err := s.key(id)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("open %s: negative offset %d", id, offset)
	}
	r := request{method: http.MethodGet, key: key, ok: []int{http.StatusOK, http.StatusPartialContent}}
	if offset > 0 {
		r.header = map[string]string{"Range": fmt.Sprintf("bytes=%d-", offset)}
	}
	resp, err := s.do(ctx, r)
	if objhttp.IsStatus(err, http.StatusRequestedRangeNotSatisfiable) {
		// S3 refuses a range starting at the end; reading from the end
		// is the empty file, reading past it an error.
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
	if offset > 0 && resp.StatusCode != http.StatusPartialContent {
		// The whole object came back: skip to offset.
		if _, err := io.CopyN(io.Discard, resp.Body, offset); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("open %s: skip to %d: %w", id, offset, err)
		}
	}
	return resp.Body, nil
}

// Stat implements filestore.Store.
func (s *Store) Stat(ctx context.Context, id string) (filestore.Info, error) {
	key, err := s.key(id)
	if err != nil {
		return filestore.Info{}, err
	}
	resp, err := s.do(ctx, request{method: http.MethodHead, key: key, ok: []int{http.StatusOK}})
	if err != nil {
		return filestore.Info{}, wrap("stat", id, err)
	}
	drain(resp)
	size, err := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	if err != nil {
		return filestore.Info{}, fmt.Errorf("stat %s: Content-Length %q", id, resp.Header.Get("Content-Length"))
	}
	written, err := http.ParseTime(resp.Header.Get("Last-Modified"))
	if err != nil {
		return filestore.Info{}, fmt.Errorf("stat %s: Last-Modified %q", id, resp.Header.Get("Last-Modified"))
	}
	return filestore.Info{Size: size, Written: written}, nil
}

// Delete implements filestore.Store.
func (s *Store) Delete(ctx context.Context, id string) error {
	key, err := s.key(id)
	if err != nil {
		return err
	}
	resp, err := s.do(ctx, request{method: http.MethodDelete, key: key, ok: []int{http.StatusNoContent, http.StatusOK}})
	if err != nil && !objhttp.IsStatus(err, http.StatusNotFound) {
		return wrap("delete", id, err)
	}
	if err == nil {
		drain(resp)
	}
	return nil
}

// List implements filestore.Lister: the objects under Prefix whose rest
// of key is a valid id.
func (s *Store) List(ctx context.Context, fn func(id string, info filestore.Info) error) error {
	q := url.Values{"list-type": {"2"}, "prefix": {s.prefix}}
	for {
		resp, err := s.do(ctx, request{method: http.MethodGet, query: q, ok: []int{http.StatusOK}})
		if err != nil {
			return fmt.Errorf("list %s/%s: %w", s.bucket, s.prefix, err)
		}
		var page struct {
			Contents []struct {
				Key          string    `xml:"Key"`
				Size         int64     `xml:"Size"`
				LastModified time.Time `xml:"LastModified"`
			} `xml:"Contents"`
			IsTruncated           bool   `xml:"IsTruncated"`
			NextContinuationToken string `xml:"NextContinuationToken"`
		}
		if err := readXML(resp, &page); err != nil {
			return fmt.Errorf("list %s/%s: %w", s.bucket, s.prefix, err)
		}
		for _, o := range page.Contents {
			id := strings.TrimPrefix(o.Key, s.prefix)
			if filestore.ValidateID(id) != nil {
				continue
			}
			if err := fn(id, filestore.Info{Size: o.Size, Written: o.LastModified}); err != nil {
				return err
			}
		}
		if !page.IsTruncated || page.NextContinuationToken == "" {
			return nil
		}
		q.Set("continuation-token", page.NextContinuationToken)
	}
}
