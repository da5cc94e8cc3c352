package gcsmultipart_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/transform"
	"github.com/sluice-io/sluice/core/transform/gcsmultipart"
	"github.com/sluice-io/sluice/core/wire"
)

var whisper = map[string]string{"provider": "whisper"}

func newTransform(t *testing.T, providers ...string) *gcsmultipart.Transform {
	t.Helper()
	tr, err := gcsmultipart.New(providers...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// v4URL is a V4 signed URL signed at start, valid for secs seconds.
func v4URL(start time.Time, secs int64) string {
	return fmt.Sprintf("https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Date=%s&X-Goog-Expires=%d&X-Goog-Signature=ab",
		start.UTC().Format("20060102T150405Z"), secs)
}

// v2URL is a V2 signed URL expiring at exp.
func v2URL(exp time.Time) string {
	return fmt.Sprintf("https://storage.googleapis.com/b/o?GoogleAccessId=x&Expires=%d&Signature=ab", exp.Unix())
}

func body(uri string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "whisper-1", "gcs_uri": uri})
	return b
}

func TestFactory(t *testing.T) {
	tests := []struct {
		name    string
		params  string
		wantErr string
	}{
		{"one", `{"providers":["whisper"]}`, ""},
		{"several", `{"providers":["whisper","ocr"]}`, ""},
		{"empty list", `{"providers":[]}`, `at least one entry in "providers" is required`},
		{"missing list", `{}`, `at least one entry in "providers" is required`},
		{"null list", `{"providers":null}`, `at least one entry in "providers" is required`},
		{"no parameters", ``, `at least one entry in "providers" is required`},
		{"null parameters", `null`, `at least one entry in "providers" is required`},
		{"empty provider", `{"providers":["whisper",""]}`, `"providers" entries must be non-empty`},
		{"unknown key", `{"providers":["whisper"],"foo":1}`, `invalid parameters: json: unknown field "foo"`},
		{"not a list", `{"providers":"whisper"}`, "invalid parameters: json: cannot unmarshal string"},
		{"malformed", `{"providers":`, "invalid parameters: unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := gcsmultipart.Factory(json.RawMessage(tt.params), transform.Env{})
			if tt.wantErr == "" {
				if err != nil || tr == nil {
					t.Fatalf("Factory = %v, %v", tr, err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr && !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Fatalf("Factory = %v, want error %q", err, tt.wantErr)
			}
		})
	}
}

func TestSignedURLExpiry(t *testing.T) {
	ref := time.Date(2026, 6, 18, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		url  string
		want time.Time // zero: no expiry
	}{
		{"v4", "https://x/o?X-Goog-Date=20260618T110000Z&X-Goog-Expires=3600", ref},
		{"v4 wins over v2", fmt.Sprintf("https://x/o?X-Goog-Date=20260618T110000Z&X-Goog-Expires=3600&Expires=%d", ref.Unix()+99), ref},
		{"v2", fmt.Sprintf("https://x/o?Expires=%d", ref.Unix()), ref},
		{"v4 date alone falls back to v2", fmt.Sprintf("https://x/o?X-Goog-Date=20260618T110000Z&Expires=%d", ref.Unix()), ref},
		{"v4 expires alone falls back to v2", fmt.Sprintf("https://x/o?X-Goog-Expires=5&Expires=%d", ref.Unix()), ref},
		{"v4 bad date: no expiry, no fallback", fmt.Sprintf("https://x/o?X-Goog-Date=nope&X-Goog-Expires=3600&Expires=%d", ref.Unix()), time.Time{}},
		{"v4 bad expires", "https://x/o?X-Goog-Date=20260618T110000Z&X-Goog-Expires=1h", time.Time{}},
		{"v4 negative expires", "https://x/o?X-Goog-Date=20260618T130000Z&X-Goog-Expires=-3600", ref},
		{"v4 huge expires does not wrap", "https://x/o?X-Goog-Date=20260618T110000Z&X-Goog-Expires=9223372036854775807",
			time.Date(2026, 6, 18, 11, 0, 0, 0, time.UTC).Add(time.Duration(1<<63 - 1)).Truncate(time.Second)},
		{"v2 bad", "https://x/o?Expires=soon", time.Time{}},
		{"names are case-sensitive", fmt.Sprintf("https://x/o?x-goog-date=20260618T110000Z&x-goog-expires=3600&expires=%d", ref.Unix()), time.Time{}},
		{"first value counts", fmt.Sprintf("https://x/o?Expires=%d&Expires=1", ref.Unix()), ref},
		{"escaped values", "https://x/o?X-Goog-Date=20260618T110000Z&X-Goog-Expires=%33600", ref},
		{"none", "https://x/o?sig=abc", time.Time{}},
		{"not a URL", "https://x/o\x7f?Expires=1", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := gcsmultipart.SignedURLExpiry(tt.url)
			if ok != !tt.want.IsZero() || (ok && !got.Equal(tt.want)) {
				t.Errorf("SignedURLExpiry = %s, %v; want %s", got, ok, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tr := newTransform(t, "whisper", "ocr")
	ctx := context.Background()
	dl := time.Date(2026, 6, 18, 12, 0, 0, 0, time.UTC)
	const rejected = "signed URL expires at %s, at or before the request deadline %s"
	tests := []struct {
		name     string
		payload  string
		metadata map[string]string
		deadline time.Time
		wantErr  string
	}{
		{name: "v4 after deadline", payload: string(body(v4URL(dl.Add(-time.Hour), 3601))), metadata: whisper, deadline: dl},
		{name: "v4 at deadline", payload: string(body(v4URL(dl.Add(-time.Hour), 3600))), metadata: whisper, deadline: dl,
			wantErr: fmt.Sprintf(rejected, "2026-06-18T12:00:00Z", "2026-06-18T12:00:00Z")},
		{name: "v4 before deadline", payload: string(body(v4URL(dl.Add(-time.Hour), 3599))), metadata: whisper, deadline: dl,
			wantErr: fmt.Sprintf(rejected, "2026-06-18T11:59:59Z", "2026-06-18T12:00:00Z")},
		{name: "v2 after deadline", payload: string(body(v2URL(dl.Add(time.Second)))), metadata: whisper, deadline: dl},
		{name: "v2 at deadline", payload: string(body(v2URL(dl))), metadata: whisper, deadline: dl,
			wantErr: fmt.Sprintf(rejected, "2026-06-18T12:00:00Z", "2026-06-18T12:00:00Z")},
		{name: "fractional deadline after expiry", payload: string(body(v2URL(dl))), metadata: whisper,
			deadline: dl.Add(500 * time.Millisecond), wantErr: fmt.Sprintf(rejected, "2026-06-18T12:00:00Z", "2026-06-18T12:00:00Z")},
		{name: "fractional deadline before expiry", payload: string(body(v2URL(dl))), metadata: whisper,
			deadline: dl.Add(-500 * time.Millisecond)},
		{name: "deadline in another zone is printed in UTC", payload: string(body(v2URL(dl))), metadata: whisper,
			deadline: dl.In(time.FixedZone("X", 3600)), wantErr: fmt.Sprintf(rejected, "2026-06-18T12:00:00Z", "2026-06-18T12:00:00Z")},
		{name: "other owned provider", payload: string(body(v2URL(dl))), metadata: map[string]string{"provider": "ocr"}, deadline: dl,
			wantErr: "signed URL expires at"},
		{name: "no expiry", payload: string(body("https://x/o?sig=1")), metadata: whisper, deadline: dl},
		{name: "no gcs_uri", payload: `{"model":"m"}`, metadata: whisper, deadline: dl},
		{name: "empty gcs_uri", payload: `{"gcs_uri":""}`, metadata: whisper, deadline: dl},
		{name: "gcs_uri not a string", payload: `{"gcs_uri":{"url":"https://x/o?Expires=1"}}`, metadata: whisper, deadline: dl},
		{name: "gcs_uri null", payload: `{"gcs_uri":null}`, metadata: whisper, deadline: dl},
		{name: "owned, not an object", payload: `["gcs_uri"]`, metadata: whisper, deadline: dl,
			wantErr: "failed to parse request body: json: cannot unmarshal array"},
		{name: "owned, null", payload: `null`, metadata: whisper, deadline: dl,
			wantErr: "failed to parse request body: not a JSON object"},
		{name: "owned, not JSON", payload: `{"gcs_uri":`, metadata: whisper, deadline: dl,
			wantErr: "failed to parse request body: unexpected end of JSON input"},
		{name: "unowned expired", payload: string(body(v2URL(dl))), metadata: map[string]string{"provider": "other"}, deadline: dl},
		{name: "unowned not JSON", payload: `nope`, metadata: map[string]string{"provider": "other"}, deadline: dl},
		{name: "no provider", payload: string(body(v2URL(dl))), metadata: nil, deadline: dl},
		{name: "empty provider", payload: string(body(v2URL(dl))), metadata: map[string]string{"provider": ""}, deadline: dl},
		{name: "no deadline", payload: string(body(v2URL(dl))), metadata: whisper},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tr.Validate(ctx, []byte(tt.payload), tt.metadata, tt.deadline)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

type part struct{ name, value, file string }

// parts parses a multipart/form-data body in order.
func parts(t *testing.T, contentType string, b []byte) []part {
	t.Helper()
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		t.Fatalf("content type %q: %s %v %v", contentType, mt, params, err)
	}
	r := multipart.NewReader(strings.NewReader(string(b)), params["boundary"])
	var out []part
	for {
		p, err := r.NextPart()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("NextPart: %v", err)
		}
		v, err := io.ReadAll(p)
		if err != nil {
			t.Fatalf("part %s: %v", p.FormName(), err)
		}
		out = append(out, part{p.FormName(), string(v), p.FileName()})
	}
}

func TestApply(t *testing.T) {
	tr := newTransform(t, "whisper")
	ctx := context.Background()
	payload := []byte(`{"zeta":"last","model":"whisper-1","gcs_uri":"https://storage.googleapis.com/b/o?X-Goog-Signature=a%2Fb&x=1",` +
		`"file_base64":"","temperature":0.50,"stream":true,"language":null,"opts":{"a": [1, 2]},"tags":["x","y"],` +
		`"prompt":"line1\nline2 \u00e9 \"q\"","url":"from-body","big":12345678901234567890}`)
	b, ct, handled, err := tr.Apply(ctx, payload, whisper)
	if err != nil || !handled {
		t.Fatalf("Apply: handled %v, %v", handled, err)
	}
	if !strings.HasPrefix(ct, "multipart/form-data; boundary=") {
		t.Errorf("content type %q", ct)
	}
	want := []part{
		{name: "url", value: "https://storage.googleapis.com/b/o?X-Goog-Signature=a%2Fb&x=1"},
		{name: "big", value: "12345678901234567890"},
		{name: "language", value: ""},
		{name: "model", value: "whisper-1"},
		{name: "opts", value: `{"a": [1, 2]}`},
		{name: "prompt", value: "line1\nline2 é \"q\""},
		{name: "stream", value: "true"},
		{name: "tags", value: `["x","y"]`},
		{name: "temperature", value: "0.50"},
		{name: "url", value: "from-body"},
		{name: "zeta", value: "last"},
	}
	got := parts(t, ct, b)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parts:\n got %q\nwant %q", got, want)
	}
	// The same request gives the same body, but for the boundary.
	b2, ct2, _, _ := tr.Apply(ctx, payload, whisper)
	if fmt.Sprint(parts(t, ct2, b2)) != fmt.Sprint(got) {
		t.Errorf("a second Apply gave other parts")
	}
	if string(payload[:6]) != `{"zeta` {
		t.Errorf("payload modified")
	}
}

func TestApplyFileBase64(t *testing.T) {
	tr := newTransform(t, "whisper")
	_, _, handled, err := tr.Apply(context.Background(), []byte(`{"gcs_uri":"https://x/o","file_base64":"QUJD"}`), whisper)
	if handled || err == nil || err.Error() != `"file_base64" is not supported on the multipart path` {
		t.Fatalf("Apply: handled %v, %v", handled, err)
	}
	// Not a string, or empty: dropped.
	for _, p := range []string{`{"gcs_uri":"https://x/o","file_base64":5}`, `{"gcs_uri":"https://x/o","file_base64":""}`} {
		b, ct, handled, err := tr.Apply(context.Background(), []byte(p), whisper)
		if err != nil || !handled {
			t.Fatalf("%s: handled %v, %v", p, handled, err)
		}
		if got := parts(t, ct, b); fmt.Sprint(got) != fmt.Sprint([]part{{name: "url", value: "https://x/o"}}) {
			t.Errorf("%s: parts %q", p, got)
		}
	}
}

func TestApplyNotHandled(t *testing.T) {
	tr := newTransform(t, "whisper")
	for _, tt := range []struct {
		name     string
		payload  string
		metadata map[string]string
	}{
		{"other provider", `{"gcs_uri":"https://x/o"}`, map[string]string{"provider": "other"}},
		{"no provider", `{"gcs_uri":"https://x/o"}`, nil},
		{"unowned, not JSON", `nope`, map[string]string{"provider": "other"}},
		{"no gcs_uri", `{"model":"whisper-1"}`, whisper},
		{"empty gcs_uri", `{"gcs_uri":""}`, whisper},
		{"gcs_uri not a string", `{"gcs_uri":1}`, whisper},
		{"no gcs_uri, file_base64", `{"file_base64":"QUJD"}`, whisper},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, ct, handled, err := tr.Apply(context.Background(), []byte(tt.payload), tt.metadata)
			if handled || err != nil || b != nil || ct != "" {
				t.Errorf("Apply = %q, %q, %v, %v; want not handled", b, ct, handled, err)
			}
		})
	}
	if _, _, _, err := tr.Apply(context.Background(), []byte(`[1]`), whisper); err == nil ||
		!strings.HasPrefix(err.Error(), "failed to parse request body: ") {
		t.Errorf("owned array: %v", err)
	}
}

// loadChain builds the chain the config file would, with the transform
// registered as the binary registers it.
func loadChain(t *testing.T, cfg string) *transform.Chain {
	t.Helper()
	r := transform.NewRegistry()
	if err := r.Register(gcsmultipart.Type, gcsmultipart.Factory); err != nil {
		t.Fatal(err)
	}
	parsed, err := transform.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	c, err := transform.NewChain(parsed, r, transform.Env{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const chainConfig = `{"requestTransforms":[{"name":"whisper-multipart","type":"gcs_uri_multipart","parameters":{"providers":["whisper"]}}]}`

func TestInChain(t *testing.T) {
	c := loadChain(t, chainConfig)
	ctx := context.Background()
	dl := time.Date(2026, 6, 18, 12, 0, 0, 0, time.UTC)
	err := c.Validate(ctx, body(v2URL(dl)), whisper, dl)
	if err == nil || err.Error() != "transform whisper-multipart/gcs_uri_multipart: signed URL expires at 2026-06-18T12:00:00Z, at or before the request deadline 2026-06-18T12:00:00Z" {
		t.Errorf("Validate = %v", err)
	}
	_, _, _, err = c.Apply(ctx, []byte(`{"gcs_uri":"https://x/o","file_base64":"QUJD"}`), whisper)
	if err == nil || err.Error() != `transform whisper-multipart/gcs_uri_multipart: "file_base64" is not supported on the multipart path` {
		t.Errorf("Apply = %v", err)
	}
	if _, err := transform.NewChain(transform.Config{RequestTransforms: []transform.Entry{
		{Name: "w", Type: gcsmultipart.Type, Parameters: json.RawMessage(`{"providers":[]}`)}}}, registry(t), transform.Env{}); err == nil ||
		err.Error() != `requestTransforms[0] "w": gcs_uri_multipart: at least one entry in "providers" is required` {
		t.Errorf("NewChain = %v", err)
	}
}

func registry(t *testing.T) *transform.Registry {
	t.Helper()
	r := transform.NewRegistry()
	if err := r.Register(gcsmultipart.Type, gcsmultipart.Factory); err != nil {
		t.Fatal(err)
	}
	return r
}

// End to end: the chain's body goes out through dispatch with its content
// type, over HTTP/1.1 and h2c, and the gateway reads the form; a request
// the chain does not handle goes out as the producer's JSON.
func TestDispatched(t *testing.T) {
	for _, proto := range []string{dispatch.ProtocolHTTP1, dispatch.ProtocolH2C} {
		t.Run(proto, func(t *testing.T) { testDispatched(t, proto) })
	}
}

func testDispatched(t *testing.T, proto string) {
	type seen struct {
		major  int
		ctype  string
		form   map[string][]string
		body   string
		fair   string
		length int64
	}
	got := make(chan seen, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seen{major: r.ProtoMajor, ctype: r.Header.Get("Content-Type"), fair: r.Header.Get("X-Llm-D-Inference-Fairness-Id"),
			length: r.ContentLength}
		if strings.HasPrefix(s.ctype, "multipart/") {
			if err := r.ParseMultipartForm(1 << 20); err != nil {
				t.Errorf("ParseMultipartForm: %v", err)
			} else {
				s.form = r.MultipartForm.Value
			}
		} else {
			b, _ := io.ReadAll(r.Body)
			s.body = string(b)
		}
		got <- s
		_, _ = io.WriteString(w, `{"text":"hello"}`)
	}))
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &protocols
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	client, err := dispatch.New(dispatch.Config{Protocol: proto})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	chain := loadChain(t, chainConfig)
	target := dispatch.Target{BaseURL: srv.URL, Path: "/v1/audio/transcriptions"}
	wantMajor := map[string]int{dispatch.ProtocolHTTP1: 1, dispatch.ProtocolH2C: 2}[proto]

	send := func(req *wire.Request) seen {
		t.Helper()
		ctx := context.Background()
		if err := chain.Validate(ctx, req.Payload, req.Metadata, req.Deadline); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		b, ct, _, err := chain.Apply(ctx, req.Payload, req.Metadata)
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		out := client.DoWith(ctx, target, req, dispatch.Overrides{Body: b, ContentType: ct})
		if out.Class != dispatch.Success || string(out.Body) != `{"text":"hello"}` {
			t.Fatalf("outcome: %+v", out)
		}
		s := <-got
		if s.major != wantMajor {
			t.Errorf("HTTP/%d, want HTTP/%d", s.major, wantMajor)
		}
		return s
	}

	uri := v4URL(time.Now(), 3600)
	s := send(&wire.Request{
		ID: "r1", Deadline: time.Now().Add(time.Minute),
		Payload:  []byte(`{"model":"whisper-1","gcs_uri":"` + uri + `","temperature":0,"language":"en"}`),
		Metadata: map[string]string{"provider": "whisper", "userid": "tenant-7"},
	})
	if !strings.HasPrefix(s.ctype, "multipart/form-data; boundary=") || s.length <= 0 {
		t.Errorf("content type %q, length %d", s.ctype, s.length)
	}
	want := map[string][]string{"url": {uri}, "model": {"whisper-1"}, "temperature": {"0"}, "language": {"en"}}
	if fmt.Sprint(s.form) != fmt.Sprint(want) {
		t.Errorf("form = %v, want %v", s.form, want)
	}
	if s.fair != "tenant-7" {
		t.Errorf("fairness header %q", s.fair)
	}

	payload := `{"model":"m",  "prompt":"hi"}`
	s = send(&wire.Request{ID: "r2", Deadline: time.Now().Add(time.Minute), Payload: []byte(payload),
		Metadata: map[string]string{"provider": "other"}})
	if s.ctype != "application/json" || s.body != payload {
		t.Errorf("unhandled request: content type %q, body %q", s.ctype, s.body)
	}
}
