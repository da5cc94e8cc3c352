// Package s3 is the filestore backend for Amazon S3 and S3-compatible
// stores (MinIO, Ceph RGW, R2, …), on aws-sdk-go-v2.
//
// A Put streams: it reads the source one part at a time (PartSize bytes,
// one buffer per Put) and sends a file that fits in one part as a single
// PutObject, a larger one as a multipart upload, which S3 publishes under
// its key only when CompleteMultipartUpload succeeds; a failed or
// cancelled Put aborts the upload, so no partial object is ever visible
// under a final id. The part loop is this package's own rather than the
// SDK's upload manager (feature/s3/manager is deprecated by its makers and
// its successor, transfermanager, is still v0): sequential parts keep the
// memory of one Put at exactly one part and the code is short.
package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/sluice-io/sluice/front/filestore"
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
	// Region is the bucket's region. Default: AWS_REGION, else us-east-1.
	Region string `json:"region,omitempty" yaml:"region,omitempty"`
	// Endpoint is the URL of an S3-compatible store ("" for AWS S3).
	Endpoint string `json:"endpoint,omitempty" yaml:"endpoint,omitempty"`
	// PathStyle addresses buckets as endpoint/bucket/key rather than
	// bucket.endpoint/key (most S3-compatible stores want it).
	PathStyle bool `json:"path_style,omitempty" yaml:"path_style,omitempty"`
	// AccessKeyID and SecretAccessKey, when both set, are static
	// credentials; otherwise the SDK's default chain is used (environment,
	// shared config and credentials files, web identity, instance role).
	AccessKeyID     string `json:"access_key_id,omitempty" yaml:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty" yaml:"secret_access_key,omitempty"`
	// PartSize is the size of each uploaded part and of the one buffer a
	// Put holds. Default 16 MiB; 5 MiB to 5 GiB. A file is at most 10,000
	// parts (160 GiB at the default).
	PartSize int64 `json:"part_size,omitempty" yaml:"part_size,omitempty"`
	// ChecksumWhenRequired sends request checksums only where S3 requires
	// them, for S3-compatible stores that refuse the SDK's default
	// checksums.
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
	client   *s3.Client
	bucket   string
	prefix   string
	partSize int64
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
	var opts []func(*awsconfig.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, awsconfig.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 filestore: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.DisableLogOutputChecksumValidationSkipped = true
		if cfg.ChecksumWhenRequired {
			o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
			o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		}
	})
	return &Store{client: client, bucket: cfg.Bucket, prefix: cfg.Prefix, partSize: cfg.PartSize}, nil
}

// Client is the S3 client the store uses.
func (s *Store) Client() *s3.Client { return s.client }

func (s *Store) key(id string) (string, error) {
	if err := filestore.ValidateID(id); err != nil {
		return "", err
	}
	return s.prefix + id, nil
}

func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var re *awshttp.ResponseError
	return errors.As(err, &nsk) || errors.As(err, &nf) || (errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound)
}

func wrap(op, id string, err error) error {
	if isNotFound(err) {
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

// Put implements filestore.Store.
func (s *Store) Put(ctx context.Context, id string, r io.Reader) (int64, error) {
	key, err := s.key(id)
	if err != nil {
		return 0, err
	}
	r = ctxReader{ctx, r}
	var buf bytes.Buffer
	full, err := s.fill(&buf, r)
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if !full {
		n := int64(buf.Len())
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(buf.Bytes()), ContentLength: aws.Int64(n),
		})
		if err != nil {
			return 0, wrap("put", id, err)
		}
		return n, nil
	}
	up, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return 0, wrap("put", id, err)
	}
	n, err := s.uploadParts(ctx, key, up.UploadId, &buf, r)
	if err != nil {
		// Abort even when ctx is done, so the store drops the parts.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, aerr := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: &key, UploadId: up.UploadId}); aerr != nil {
			err = errors.Join(err, fmt.Errorf("abort upload: %w", aerr))
		}
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	return n, nil
}

// uploadParts sends buf (a full first part) and the rest of r as parts of
// upload id, then completes it.
func (s *Store) uploadParts(ctx context.Context, key string, uploadID *string, buf *bytes.Buffer, r io.Reader) (int64, error) {
	var parts []types.CompletedPart
	var total int64
	full := true
	for num := int32(1); buf.Len() > 0; num++ {
		if num > maxParts {
			return 0, fmt.Errorf("more than %d parts of %d bytes", maxParts, s.partSize)
		}
		size := int64(buf.Len())
		out, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: &s.bucket, Key: &key, UploadId: uploadID, PartNumber: aws.Int32(num),
			Body: bytes.NewReader(buf.Bytes()), ContentLength: aws.Int64(size),
		})
		if err != nil {
			return 0, fmt.Errorf("part %d: %w", num, err)
		}
		parts = append(parts, types.CompletedPart{
			ETag: out.ETag, PartNumber: aws.Int32(num),
			ChecksumCRC32: out.ChecksumCRC32, ChecksumCRC32C: out.ChecksumCRC32C, ChecksumCRC64NVME: out.ChecksumCRC64NVME,
			ChecksumSHA1: out.ChecksumSHA1, ChecksumSHA256: out.ChecksumSHA256,
		})
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
	_, err := s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &s.bucket, Key: &key, UploadId: uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		return 0, fmt.Errorf("complete: %w", err)
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
	in := &s3.GetObjectInput{Bucket: &s.bucket, Key: &key}
	var optFns []func(*s3.Options)
	if offset > 0 {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
		// A whole object's checksum cannot check a part of it.
		optFns = append(optFns, func(o *s3.Options) { o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired })
	}
	out, err := s.client.GetObject(ctx, in, optFns...)
	var re *awshttp.ResponseError
	if err != nil && errors.As(err, &re) && re.HTTPStatusCode() == http.StatusRequestedRangeNotSatisfiable {
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
	return out.Body, nil
}

// Stat implements filestore.Store.
func (s *Store) Stat(ctx context.Context, id string) (filestore.Info, error) {
	key, err := s.key(id)
	if err != nil {
		return filestore.Info{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return filestore.Info{}, wrap("stat", id, err)
	}
	return filestore.Info{Size: aws.ToInt64(out.ContentLength), Written: aws.ToTime(out.LastModified)}, nil
}

// Delete implements filestore.Store.
func (s *Store) Delete(ctx context.Context, id string) error {
	key, err := s.key(id)
	if err != nil {
		return err
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil && !isNotFound(err) {
		return wrap("delete", id, err)
	}
	return nil
}

// List implements filestore.Lister: the objects under Prefix whose rest
// of key is a valid id.
func (s *Store) List(ctx context.Context, fn func(id string, info filestore.Info) error) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list %s/%s: %w", s.bucket, s.prefix, err)
		}
		for _, o := range page.Contents {
			id := strings.TrimPrefix(aws.ToString(o.Key), s.prefix)
			if filestore.ValidateID(id) != nil {
				continue
			}
			if err := fn(id, filestore.Info{Size: aws.ToInt64(o.Size), Written: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}
