// Package gcs is the filestore backend for Google Cloud Storage, on its
// JSON API over net/http, with credentials from cloud.google.com/go/auth
// (Application Default Credentials or a service-account key file).
//
// It speaks the API directly rather than through cloud.google.com/go/storage,
// which links gRPC's xDS, Envoy's protos, S2A and SPIFFE into the binary
// (about 17 MB of a release build) for five calls.
//
// A file that fits in one chunk (ChunkSize) goes up as one media upload; a
// larger one as a resumable upload, one chunk at a time (the one buffer a
// Put holds). GCS creates the object only when an upload is finalised, so
// a failed or cancelled Put leaves no object under the id (the resumable
// session is cancelled).
package gcs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/auth/credentials"

	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/internal/objhttp"
)

// DefaultChunkSize is the upload chunk (and the buffer one Put holds).
const DefaultChunkSize = 16 << 20

// DefaultEndpoint is the JSON API's base URL.
const DefaultEndpoint = "https://storage.googleapis.com/storage/v1/"

// scope is the OAuth scope the store's credentials are asked for.
const scope = "https://www.googleapis.com/auth/devstorage.full_control"

// Config configures a GCS store.
type Config struct {
	// Bucket holds the files (required; it must exist).
	Bucket string `json:"bucket" yaml:"bucket"`
	// Prefix is prepended to every id to make its object name.
	Prefix string `json:"prefix,omitempty" yaml:"prefix,omitempty"`
	// Endpoint is the JSON API's base URL for an emulator (e.g.
	// "http://127.0.0.1:4443/storage/v1/"); "" for GCS itself, or, when
	// STORAGE_EMULATOR_HOST is set, that host without credentials.
	// Uploads go to the same host under "/upload" + the path.
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
	hc     *http.Client
	creds  *auth.Credentials // nil: requests go without credentials
	api    string            // the JSON API's base URL, ending in "/"
	upload string            // the upload base URL, ending in "/"
	bucket string
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
	endpoint, noAuth := cfg.Endpoint, cfg.NoAuth
	if endpoint == "" {
		endpoint = DefaultEndpoint
		if host := os.Getenv("STORAGE_EMULATOR_HOST"); host != "" {
			if !strings.Contains(host, "://") {
				host = "http://" + host
			}
			endpoint, noAuth = strings.TrimSuffix(host, "/")+"/storage/v1/", true
		}
	}
	if !strings.HasSuffix(endpoint, "/") {
		endpoint += "/"
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("gcs filestore: endpoint: %w", err)
	}
	up := *u
	up.Path = "/upload" + u.Path
	s := &Store{
		hc: &http.Client{}, api: endpoint, upload: up.String(),
		bucket: cfg.Bucket, prefix: cfg.Prefix, chunk: cfg.ChunkSize,
	}
	if !noAuth {
		opts := &credentials.DetectOptions{Scopes: []string{scope}}
		if cfg.CredentialsFile != "" {
			s.creds, err = credentials.NewCredentialsFromFile(credentials.ServiceAccount, cfg.CredentialsFile, opts)
		} else {
			s.creds, err = credentials.DetectDefault(opts)
		}
		if err != nil {
			return nil, fmt.Errorf("gcs filestore: credentials: %w", err)
		}
	}
	return s, nil
}

// Close releases the client's idle connections.
func (s *Store) Close() error {
	s.hc.CloseIdleConnections()
	return nil
}

func (s *Store) name(id string) (string, error) {
	if err := filestore.ValidateID(id); err != nil {
		return "", err
	}
	return s.prefix + id, nil
}

// objectURL is the JSON API's URL of object name.
func (s *Store) objectURL(name string) string {
	return s.api + "b/" + url.PathEscape(s.bucket) + "/o/" + url.PathEscape(name)
}

func wrap(op, id string, err error) error {
	if objhttp.IsStatus(err, http.StatusNotFound) {
		return fmt.Errorf("%s %s: %w", op, id, filestore.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, id, err)
}

// errorMessage reads the JSON API's error body.
func errorMessage(_ int, body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(body))
}

// do sends method url with body (nil: none) and headers hdr (key, value
// pairs), credentials added, and returns the response when its status is
// one of ok.
func (s *Store) do(ctx context.Context, method, u string, body []byte, hdr []string, ok ...int) (*http.Response, error) {
	return objhttp.Do(ctx, s.hc, func() (*http.Request, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return nil, err
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		if s.creds != nil {
			tok, err := s.creds.Token(ctx)
			if err != nil {
				return nil, fmt.Errorf("credentials: %w", err)
			}
			typ := tok.Type
			if typ == "" {
				typ = "Bearer"
			}
			req.Header.Set("Authorization", typ+" "+tok.Value)
		}
		return req, nil
	}, errorMessage, ok...)
}

// Put implements filestore.Store.
func (s *Store) Put(ctx context.Context, id string, r io.Reader) (int64, error) {
	name, err := s.name(id)
	if err != nil {
		return 0, err
	}
	br := bufio.NewReaderSize(objhttp.CtxReader{Ctx: ctx, R: r}, 16)
	buf := make([]byte, s.chunk)
	n, last, err := fill(br, buf)
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	if last {
		u := s.upload + "b/" + url.PathEscape(s.bucket) + "/o?uploadType=media&name=" + url.QueryEscape(name)
		resp, err := s.do(ctx, http.MethodPost, u, buf[:n], []string{"Content-Type", "application/octet-stream"}, http.StatusOK, http.StatusCreated)
		if err != nil {
			return 0, wrap("put", id, err)
		}
		drain(resp)
		return int64(n), nil
	}
	session, err := s.startResumable(ctx, name)
	if err != nil {
		return 0, wrap("put", id, err)
	}
	total, err := s.sendChunks(ctx, session, br, buf, n)
	if err != nil {
		// Cancel the session even when ctx is done, so GCS drops what it kept.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if resp, cerr := s.do(cctx, http.MethodDelete, session, nil, nil, 499, http.StatusNoContent, http.StatusOK, http.StatusNotFound); cerr == nil {
			drain(resp)
		}
		return 0, fmt.Errorf("put %s: %w", id, err)
	}
	return total, nil
}

// fill reads the next chunk of br into buf; last says whether br has
// nothing after it.
func fill(br *bufio.Reader, buf []byte) (n int, last bool, err error) {
	n, err = io.ReadFull(br, buf)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return n, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	if _, err := br.Peek(1); err == io.EOF {
		return n, true, nil
	} else if err != nil {
		return 0, false, err
	}
	return n, false, nil
}

// startResumable opens a resumable upload of object name and returns its
// session URL.
func (s *Store) startResumable(ctx context.Context, name string) (string, error) {
	meta, err := json.Marshal(map[string]string{"name": name, "contentType": "application/octet-stream"})
	if err != nil {
		return "", err
	}
	u := s.upload + "b/" + url.PathEscape(s.bucket) + "/o?uploadType=resumable&name=" + url.QueryEscape(name)
	resp, err := s.do(ctx, http.MethodPost, u, meta, []string{"Content-Type", "application/json; charset=UTF-8"}, http.StatusOK, http.StatusCreated)
	if err != nil {
		return "", err
	}
	drain(resp)
	session := resp.Header.Get("Location")
	if session == "" {
		return "", errors.New("resumable upload: no session URL in the response")
	}
	return session, nil
}

// sendChunks sends buf[:n] (a full first chunk, more to follow) and the
// rest of br to session, the last chunk with the total, which finalises
// the object.
func (s *Store) sendChunks(ctx context.Context, session string, br *bufio.Reader, buf []byte, n int) (int64, error) {
	var off int64
	for last := false; ; {
		total := "*"
		if last {
			total = strconv.FormatInt(off+int64(n), 10)
		}
		if err := s.sendChunk(ctx, session, buf[:n], off, total, last); err != nil {
			return 0, err
		}
		off += int64(n)
		if last {
			return off, nil
		}
		var err error
		if n, last, err = fill(br, buf); err != nil {
			return 0, err
		}
	}
}

// sendChunk puts chunk at offset off of the upload; total is the upload's
// size ("*" while unknown). A non-final chunk is answered 308 with the
// range GCS kept; a chunk GCS kept only in part is sent again from there.
func (s *Store) sendChunk(ctx context.Context, session string, chunk []byte, off int64, total string, last bool) error {
	end := off + int64(len(chunk))
	for sent := off; ; {
		rng := fmt.Sprintf("bytes %d-%d/%s", sent, end-1, total)
		resp, err := s.do(ctx, http.MethodPut, session, chunk[sent-off:], []string{"Content-Range", rng}, http.StatusOK, http.StatusCreated, http.StatusPermanentRedirect)
		if err != nil {
			return err
		}
		drain(resp)
		if resp.StatusCode != http.StatusPermanentRedirect {
			if !last {
				return errors.New("resumable upload: finalised before its last chunk")
			}
			return nil
		}
		kept, ok := keptUpTo(resp.Header.Get("Range"))
		switch {
		case !ok || kept < sent:
			return fmt.Errorf("resumable upload: GCS kept %q of %d bytes sent", resp.Header.Get("Range"), end)
		case kept >= end && !last:
			return nil
		case kept >= end:
			return fmt.Errorf("resumable upload: kept all %d bytes but not finalised", end)
		}
		sent = kept
	}
}

// keptUpTo reads a resumable upload's Range header ("bytes=0-N"): the
// bytes kept end before N+1.
func keptUpTo(h string) (int64, bool) {
	_, last, ok := strings.Cut(strings.TrimPrefix(h, "bytes="), "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(last, 10, 64)
	return n + 1, err == nil
}

func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
}

// Open implements filestore.Store.
func (s *Store) Open(ctx context.Context, id string, offset int64) (io.ReadCloser, error) {
	name, err := s.name(id)
	if err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("open %s: negative offset %d", id, offset)
	}
	var hdr []string
	if offset > 0 {
		hdr = []string{"Range", fmt.Sprintf("bytes=%d-", offset)}
	}
	resp, err := s.do(ctx, http.MethodGet, s.objectURL(name)+"?alt=media", nil, hdr, http.StatusOK, http.StatusPartialContent)
	if objhttp.IsStatus(err, http.StatusRequestedRangeNotSatisfiable) {
		// GCS refuses a range starting at the end; reading from the end
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
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("open %s: offset %d is past its end", id, offset)
			}
			return nil, fmt.Errorf("open %s: %w", id, err)
		}
	}
	return resp.Body, nil
}

// object is the part of the JSON API's object resource the store reads.
type object struct {
	Name    string    `json:"name"`
	Size    string    `json:"size"` // an int64 as a string
	Updated time.Time `json:"updated"`
}

func (o object) info() (filestore.Info, error) {
	n, err := strconv.ParseInt(o.Size, 10, 64)
	if err != nil {
		return filestore.Info{}, fmt.Errorf("object %s: size %q: %w", o.Name, o.Size, err)
	}
	return filestore.Info{Size: n, Written: o.Updated}, nil
}

// getJSON GETs u and decodes its JSON body into v.
func (s *Store) getJSON(ctx context.Context, u string, v any) error {
	resp, err := s.do(ctx, http.MethodGet, u, nil, nil, http.StatusOK)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", u, err)
	}
	return nil
}

// Stat implements filestore.Store.
func (s *Store) Stat(ctx context.Context, id string) (filestore.Info, error) {
	name, err := s.name(id)
	if err != nil {
		return filestore.Info{}, err
	}
	var o object
	if err := s.getJSON(ctx, s.objectURL(name)+"?fields=name,size,updated", &o); err != nil {
		return filestore.Info{}, wrap("stat", id, err)
	}
	info, err := o.info()
	if err != nil {
		return filestore.Info{}, wrap("stat", id, err)
	}
	return info, nil
}

// Delete implements filestore.Store.
func (s *Store) Delete(ctx context.Context, id string) error {
	name, err := s.name(id)
	if err != nil {
		return err
	}
	resp, err := s.do(ctx, http.MethodDelete, s.objectURL(name), nil, nil, http.StatusNoContent, http.StatusOK)
	if err != nil && !objhttp.IsStatus(err, http.StatusNotFound) {
		return wrap("delete", id, err)
	}
	if err == nil {
		drain(resp)
	}
	return nil
}

// List implements filestore.Lister: the objects under Prefix whose rest
// of name is a valid id.
func (s *Store) List(ctx context.Context, fn func(id string, info filestore.Info) error) error {
	q := url.Values{"prefix": {s.prefix}, "fields": {"items(name,size,updated),nextPageToken"}}
	for {
		var page struct {
			Items         []object `json:"items"`
			NextPageToken string   `json:"nextPageToken"`
		}
		if err := s.getJSON(ctx, s.api+"b/"+url.PathEscape(s.bucket)+"/o?"+q.Encode(), &page); err != nil {
			return fmt.Errorf("list %s: %w", s.prefix, err)
		}
		for _, o := range page.Items {
			id := strings.TrimPrefix(o.Name, s.prefix)
			if filestore.ValidateID(id) != nil {
				continue
			}
			info, err := o.info()
			if err != nil {
				return fmt.Errorf("list %s: %w", s.prefix, err)
			}
			if err := fn(id, info); err != nil {
				return err
			}
		}
		if page.NextPageToken == "" {
			return nil
		}
		q.Set("pageToken", page.NextPageToken)
	}
}
