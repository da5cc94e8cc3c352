// Package gcsmultipart is the gcs_uri_multipart request transform
// (upstream's transform/gcsmultipart): for endpoints that take
// multipart/form-data with a `url` field naming the media (Whisper
// transcription, OCR) rather than JSON. Producers cannot put media on the
// queue, so the request's JSON carries a signed object URL (a GCS V4 or V2
// signed URL) in `gcs_uri`; at dispatch the transform sends that URL as the
// form field `url` and the payload's other top-level fields as form fields.
//
// It owns a request whose metadata.provider is one of its providers.
// Validate rejects an owned request whose signed URL expires at or before
// the request's deadline, so that a request that cannot succeed is not
// retried. Apply rewrites an owned request that has a non-empty gcs_uri.
//
// Where sluice differs from upstream:
//   - The form fields after `url` are written in sorted order, not Go's
//     random map order, so that the same request gives the same body.
//   - A JSON null payload is not an object, so it is an error (upstream
//     decodes it as an object without fields); sluice's wire format only
//     takes object payloads anyway.
//   - An X-Goog-Expires too large for a time.Duration (past 292 years)
//     means a URL that does not expire within any deadline, where upstream's
//     arithmetic overflows.
//   - Errors do not begin with upstream's "INVALID_REQ: " category: the
//     pipeline answers them with an INVALID_REQUEST result.
package gcsmultipart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime/multipart"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-io/sluice/core/transform"
)

// Type is the transform's registry name.
const Type = "gcs_uri_multipart"

// Names upstream gives a meaning to.
const (
	// ProviderKey is the metadata key matched against the providers.
	ProviderKey = "provider"
	// URIField is the payload field holding the signed object URL.
	URIField = "gcs_uri"
	// FileBase64Field holds inline media, which the multipart path refuses.
	FileBase64Field = "file_base64"
	// URLFormField is the form field the signed URL is sent in.
	URLFormField = "url"
)

// v4DateLayout is the layout of X-Goog-Date.
const v4DateLayout = "20060102T150405Z"

// maxExpiresSeconds bounds X-Goog-Expires: past it, a URL is taken to
// expire in 292 years, which no deadline reaches.
const maxExpiresSeconds = int64(time.Duration(1<<63-1) / time.Second)

// Transform rewrites owned requests with a gcs_uri into multipart/form-data.
// It is immutable and safe for concurrent use.
type Transform struct {
	providers map[string]struct{}
}

var _ transform.Transform = (*Transform)(nil)

// Params are the transform's parameters, decoded strictly.
type Params struct {
	// Providers are the metadata.provider values the transform owns:
	// required, non-empty strings.
	Providers []string `json:"providers"`
}

// New returns a transform owning the requests whose metadata.provider is
// one of providers: at least one, none empty.
func New(providers ...string) (*Transform, error) {
	if len(providers) == 0 {
		return nil, errors.New(`at least one entry in "providers" is required`)
	}
	set := make(map[string]struct{}, len(providers))
	for _, p := range providers {
		if p == "" {
			return nil, errors.New(`"providers" entries must be non-empty`)
		}
		set[p] = struct{}{}
	}
	return &Transform{providers: set}, nil
}

// Factory builds the transform from its parameters: {"providers": [...]}.
// Unknown parameters are errors.
func Factory(params json.RawMessage, _ transform.Env) (transform.Transform, error) {
	var p Params
	if len(bytes.TrimSpace(params)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(params))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("invalid parameters: %w", err)
		}
	}
	return New(p.Providers...)
}

// owns reports whether the transform handles a request with this metadata.
func (t *Transform) owns(metadata map[string]string) bool {
	_, ok := t.providers[metadata[ProviderKey]]
	return ok
}

// Validate rejects an owned request whose body is not a JSON object, or
// whose signed URL expires at or before deadline. A request it does not
// own, without a gcs_uri string, or whose URL carries no expiry it can
// read, passes.
func (t *Transform) Validate(_ context.Context, payload []byte, metadata map[string]string, deadline time.Time) error {
	if !t.owns(metadata) {
		return nil
	}
	fields, err := decodeFields(payload)
	if err != nil {
		return err
	}
	signed := stringField(fields, URIField)
	if signed == "" {
		return nil
	}
	expiry, ok := SignedURLExpiry(signed)
	if !ok || expiry.After(deadline) {
		return nil
	}
	return fmt.Errorf("signed URL expires at %s, at or before the request deadline %s",
		expiry.UTC().Format(time.RFC3339), deadline.UTC().Format(time.RFC3339))
}

// Apply rewrites an owned request with a non-empty gcs_uri string into
// multipart/form-data: the field `url` holding the gcs_uri, then every
// other top-level field but gcs_uri and file_base64, in sorted order, a
// JSON string as its text, null as an empty value and any other value as
// its JSON (3, true, {...}, [...]); a top-level "url" field is written too,
// after the signed URL, as upstream does. A non-empty file_base64 string is an error. Other requests are
// not handled.
func (t *Transform) Apply(_ context.Context, payload []byte, metadata map[string]string) ([]byte, string, bool, error) {
	if !t.owns(metadata) {
		return nil, "", false, nil
	}
	fields, err := decodeFields(payload)
	if err != nil {
		return nil, "", false, err
	}
	signed := stringField(fields, URIField)
	if signed == "" {
		return nil, "", false, nil
	}
	if stringField(fields, FileBase64Field) != "" {
		return nil, "", false, fmt.Errorf("%q is not supported on the multipart path", FileBase64Field)
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		if name != URIField && name != FileBase64Field {
			names = append(names, name)
		}
	}
	slices.Sort(names)

	var buf bytes.Buffer
	buf.Grow(len(payload) + 160*(len(names)+2))
	w := multipart.NewWriter(&buf)
	// The signed URL is a plain form field, not a file.
	if err := w.WriteField(URLFormField, signed); err != nil {
		return nil, "", false, fmt.Errorf("write field %q: %w", URLFormField, err)
	}
	for _, name := range names {
		if err := w.WriteField(name, formValue(fields[name])); err != nil {
			return nil, "", false, fmt.Errorf("write field %q: %w", name, err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, "", false, fmt.Errorf("finish multipart body: %w", err)
	}
	return buf.Bytes(), w.FormDataContentType(), true, nil
}

// decodeFields returns the payload's top-level fields, each as its raw
// JSON; a payload that is not a JSON object is an error.
func decodeFields(payload []byte) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil {
		return nil, fmt.Errorf("failed to parse request body: %w", err)
	}
	if fields == nil {
		return nil, errors.New("failed to parse request body: not a JSON object")
	}
	return fields, nil
}

// stringField returns the value of a JSON string field, or "" when the
// field is absent or not a string.
func stringField(fields map[string]json.RawMessage, name string) string {
	raw, ok := fields[name]
	if !ok || len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return ""
	}
	return s
}

// formValue renders a raw JSON value as a form value: a string unquoted,
// null as the empty string (upstream unmarshals every value into a string
// first, which null leaves empty), anything else as its JSON text.
func formValue(raw json.RawMessage) string {
	if string(raw) == "null" {
		return ""
	}
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return s
		}
	}
	return string(raw)
}

// SignedURLExpiry returns when a signed object URL expires, read from its
// query (parameter names are case-sensitive): V4 signing's X-Goog-Date
// (YYYYMMDDThhmmssZ) plus X-Goog-Expires (seconds) when both are present,
// otherwise V2 signing's Expires (Unix seconds). ok is false when the URL
// does not parse, when V4's parameters are both present but either does
// not parse, and when neither form gives an expiry.
func SignedURLExpiry(signed string) (expiry time.Time, ok bool) {
	u, err := url.Parse(signed)
	if err != nil {
		return time.Time{}, false
	}
	q := u.Query()
	if date, expires := q.Get("X-Goog-Date"), q.Get("X-Goog-Expires"); date != "" && expires != "" {
		start, err := time.Parse(v4DateLayout, date)
		if err != nil {
			return time.Time{}, false
		}
		secs, err := strconv.Atoi(expires)
		if err != nil {
			return time.Time{}, false
		}
		s := min(max(int64(secs), -maxExpiresSeconds), maxExpiresSeconds)
		return start.Add(time.Duration(s) * time.Second), true
	}
	if expires := q.Get("Expires"); expires != "" {
		secs, err := strconv.ParseInt(expires, 10, 64)
		if err != nil {
			return time.Time{}, false
		}
		return time.Unix(secs, 0), true
	}
	return time.Time{}, false
}
