package dispatch

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// buildHeaders returns the headers Do would send for req through a client
// made from cfg.
func buildHeaders(t *testing.T, cfg Config, req *wire.Request, o Overrides) (http.Header, int) {
	t.Helper()
	c := newClient(t, cfg)
	pt, err := c.target(Target{BaseURL: "http://127.0.0.1:1", InferenceObjective: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	return c.headers(pt, req, &o, req.Deadline, req.Deadline, now)
}

// upstream §3.4: the stamp, its skips and its precedence over the message.
func TestFairnessStamp(t *testing.T) {
	long := strings.Repeat("t", MaxFairnessIDBytes)
	tests := []struct {
		name     string
		fairness FairnessConfig
		metadata map[string]string
		headers  map[string]string
		header   string   // where to look
		want     []string // its values; nil: absent
	}{
		{name: "default on", metadata: map[string]string{"userid": "tenant-7"},
			header: "X-Llm-D-Inference-Fairness-Id", want: []string{"tenant-7"}},
		{name: "stamp wins over every case variant",
			metadata: map[string]string{"userid": "tenant-7"},
			headers:  map[string]string{"x-llm-d-inference-fairness-id": "a", "X-LLM-D-INFERENCE-FAIRNESS-ID": "b"},
			header:   "X-Llm-D-Inference-Fairness-Id", want: []string{"tenant-7"}},
		{name: "no id keeps caller's", metadata: map[string]string{"job_id": "j"},
			headers: map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:  "X-Llm-D-Inference-Fairness-Id", want: []string{"caller"}},
		{name: "empty id keeps caller's", metadata: map[string]string{"userid": ""},
			headers: map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:  "X-Llm-D-Inference-Fairness-Id", want: []string{"caller"}},
		{name: "no id no header", metadata: nil, header: "X-Llm-D-Inference-Fairness-Id", want: nil},
		{name: "256 bytes stamped", metadata: map[string]string{"userid": long},
			headers: map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:  "X-Llm-D-Inference-Fairness-Id", want: []string{long}},
		{name: "257 bytes keeps caller's", metadata: map[string]string{"userid": long + "t"},
			headers: map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:  "X-Llm-D-Inference-Fairness-Id", want: []string{"caller"}},
		{name: "invalid value keeps caller's", metadata: map[string]string{"userid": "a\r\nX-Evil: 1"},
			headers: map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:  "X-Llm-D-Inference-Fairness-Id", want: []string{"caller"}},
		{name: "tab and obs-text are valid", metadata: map[string]string{"userid": "a\tb\xe9"},
			header: "X-Llm-D-Inference-Fairness-Id", want: []string{"a\tb\xe9"}},
		{name: "disabled keeps caller's", fairness: FairnessConfig{Header: ptr("")},
			metadata: map[string]string{"userid": "tenant-7"},
			headers:  map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:   "X-Llm-D-Inference-Fairness-Id", want: []string{"caller"}},
		{name: "disabled stamps nothing", fairness: FairnessConfig{Header: ptr("")},
			metadata: map[string]string{"userid": "tenant-7"},
			header:   "X-Llm-D-Inference-Fairness-Id", want: nil},
		{name: "custom header and attribute", fairness: FairnessConfig{Header: ptr("x-tenant"), Attribute: "tenant"},
			metadata: map[string]string{"userid": "u", "tenant": "t-1"},
			headers:  map[string]string{"X-TENANT": "caller"},
			header:   "X-Tenant", want: []string{"t-1"}},
		{name: "custom header leaves the default alone", fairness: FairnessConfig{Header: ptr("x-tenant")},
			metadata: map[string]string{"userid": "u"},
			headers:  map[string]string{"x-llm-d-inference-fairness-id": "caller"},
			header:   "X-Llm-D-Inference-Fairness-Id", want: []string{"caller"}},
		{name: "custom attribute absent", fairness: FairnessConfig{Attribute: "tenant"},
			metadata: map[string]string{"userid": "u"},
			header:   "X-Llm-D-Inference-Fairness-Id", want: nil},
		{name: "stamp over the objective header", fairness: FairnessConfig{Header: ptr("x-gateway-inference-objective")},
			metadata: map[string]string{"userid": "u"},
			header:   "X-Gateway-Inference-Objective", want: []string{"u"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := newRequest(time.Minute)
			req.Metadata, req.Headers = tt.metadata, tt.headers
			h, refused := buildHeaders(t, Config{Fairness: tt.fairness}, req, Overrides{})
			if refused != 0 {
				t.Errorf("refused = %d", refused)
			}
			got := h[tt.header]
			if strings.Join(got, "\x00") != strings.Join(tt.want, "\x00") || (got == nil) != (tt.want == nil) {
				t.Errorf("%s = %q, want %q (all: %v)", tt.header, got, tt.want, h)
			}
		})
	}
}

func TestParseFairness(t *testing.T) {
	tests := []struct {
		name       string
		params     string
		wantHeader *string // after SetDefaults
		wantAttr   string
		wantErr    string
	}{
		{name: "absent", params: "", wantHeader: ptr(DefaultFairnessHeader), wantAttr: "userid"},
		{name: "null", params: "null", wantHeader: ptr(DefaultFairnessHeader), wantAttr: "userid"},
		{name: "empty object", params: `{}`, wantHeader: ptr(DefaultFairnessHeader), wantAttr: "userid"},
		{name: "null values", params: `{"fairness_header":null,"fairness_attribute":null}`,
			wantHeader: ptr(DefaultFairnessHeader), wantAttr: "userid"},
		{name: "disabled", params: `{"fairness_header":""}`, wantHeader: ptr(""), wantAttr: "userid"},
		{name: "custom, other policy params ignored",
			params:     `{"fairness_header":"X-Tenant","fairness_attribute":"tenant","priority_header":"x-p","tier_label":"t"}`,
			wantHeader: ptr("X-Tenant"), wantAttr: "tenant"},
		{name: "empty attribute", params: `{"fairness_attribute":""}`, wantHeader: ptr(DefaultFairnessHeader), wantAttr: "userid"},
		{name: "illegal name", params: `{"fairness_header":"x tenant"}`, wantErr: `fairness_header: "x tenant" is not a valid header name`},
		{name: "reserved name", params: `{"fairness_header":"Host"}`, wantErr: `fairness_header: "Host" is a header`},
		{name: "header not a string", params: `{"fairness_header":5}`, wantErr: "fairness_header: must be a string, got number"},
		{name: "attribute not a string", params: `{"fairness_attribute":true}`, wantErr: "fairness_attribute: must be a string, got bool"},
		{name: "not an object", params: `["x"]`, wantErr: "must be a JSON object"},
		{name: "not JSON", params: `{"fairness_header":`, wantErr: "must be a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseFairness(json.RawMessage(tt.params))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "merge policy parameters: ") {
					t.Fatalf("ParseFairness = %+v, %v; want error containing %q", f, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseFairness: %v", err)
			}
			cfg := Config{Fairness: f}
			cfg.SetDefaults()
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if *cfg.Fairness.Header != *tt.wantHeader || cfg.Fairness.Attribute != tt.wantAttr {
				t.Errorf("fairness = %q/%q, want %q/%q", *cfg.Fairness.Header, cfg.Fairness.Attribute, *tt.wantHeader, tt.wantAttr)
			}
		})
	}
}

func TestCheckHeaderName(t *testing.T) {
	c := newClient(t, Config{DeadlineHeader: "X-My-Deadline"})
	for name, want := range map[string]string{
		"x-gateway-priority":             "",
		"X-Tenant":                       "",
		"":                               "not a valid header name",
		"x priority":                     "not a valid header name",
		"x-p\r\n":                        "not a valid header name",
		"content-type":                   "does not let",
		"Transfer-Encoding":              "does not let",
		"host":                           "does not let",
		"x-my-deadline":                  "deadline or timeout",
		"X-Envoy-Upstream-Rq-Timeout-Ms": "deadline or timeout",
	} {
		err := c.CheckHeaderName(name)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want error containing %q", name, err, want)
		}
	}
	// The package-level check knows no client's headers.
	if err := CheckHeaderName("x-my-deadline"); err != nil {
		t.Errorf("CheckHeaderName: %v", err)
	}
}

// Overrides.Headers win over the message's headers and the stamp, but not
// over the deadline headers, and refused ones are counted.
func TestOverrideHeaders(t *testing.T) {
	req := newRequest(time.Minute)
	req.Metadata = map[string]string{"userid": "tenant-7"}
	req.Headers = map[string]string{"X-Gateway-Priority": "9", "x-gateway-PRIORITY": "8", "x-other": "o"}
	h, refused := buildHeaders(t, Config{}, req, Overrides{Headers: []Header{
		{"x-gateway-priority", "3"},
		{"x-llm-d-inference-fairness-id", "override"},
		{"x-request-deadline", "1"},    // refused: the client's
		{"content-type", "text/plain"}, // refused: Overrides.ContentType
		{"x-bad", "a\nb"},              // refused: invalid value
	}})
	if refused != 3 {
		t.Errorf("refused = %d, want 3", refused)
	}
	for k, want := range map[string]string{
		"X-Gateway-Priority":            "3",
		"X-Llm-D-Inference-Fairness-Id": "override",
		"X-Other":                       "o",
		"Content-Type":                  "application/json",
	} {
		if vs := h[k]; len(vs) != 1 || vs[0] != want {
			t.Errorf("%s = %q, want [%q]", k, vs, want)
		}
	}
	if v := h.Get("X-Request-Deadline"); v == "1" {
		t.Errorf("deadline header overridden")
	}
	if _, ok := h["X-Bad"]; ok {
		t.Errorf("invalid override sent")
	}
}

// A transformed body goes out with its content type, over both protocols,
// with the message's headers and the stamp around it.
func TestOverrideBody(t *testing.T) { bothProtocols(t, testOverrideBody) }

func testOverrideBody(t *testing.T, proto string) {
	type seen struct {
		ctype  []string
		body   string
		length int64
		prio   string
		fair   string
	}
	got := make(chan seen, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Values("Content-Type"), string(b), r.ContentLength,
			r.Header.Get("X-Gateway-Priority"), r.Header.Get("X-Llm-D-Inference-Fairness-Id")}
	})
	c := newClient(t, Config{Protocol: proto})
	req := newRequest(time.Minute)
	req.Metadata = map[string]string{"userid": "tenant-7"}
	req.Headers = map[string]string{"content-type": "text/plain"} // refused
	const body = "--b\r\nContent-Disposition: form-data; name=\"url\"\r\n\r\nhttps://x\r\n--b--\r\n"
	out := c.DoWith(t.Context(), Target{BaseURL: srv.URL}, req, Overrides{
		Body: []byte(body), ContentType: "multipart/form-data; boundary=b",
		Headers: []Header{{"x-gateway-priority", "4"}},
	})
	if out.Class != Success || out.Refused != 1 {
		t.Fatalf("outcome: %+v", out)
	}
	s := <-got
	if len(s.ctype) != 1 || s.ctype[0] != "multipart/form-data; boundary=b" {
		t.Errorf("content type = %q", s.ctype)
	}
	if mt, params, err := mime.ParseMediaType(s.ctype[0]); err != nil || mt != "multipart/form-data" || params["boundary"] != "b" {
		t.Errorf("content type parses as %q %v (%v)", mt, params, err)
	}
	if s.body != body || s.length != int64(len(body)) {
		t.Errorf("body = %q (length %d), want the override", s.body, s.length)
	}
	if s.prio != "4" || s.fair != "tenant-7" {
		t.Errorf("priority %q, fairness %q", s.prio, s.fair)
	}

	// An empty non-nil body replaces the payload; no content type means JSON.
	out = c.DoWith(t.Context(), Target{BaseURL: srv.URL}, req, Overrides{Body: []byte{}})
	if out.Class != Success {
		t.Fatalf("outcome: %+v", out)
	}
	if s = <-got; s.body != "" || s.length != 0 || len(s.ctype) != 1 || s.ctype[0] != "application/json" {
		t.Errorf("empty body: got %+v", s)
	}
}

func TestOverrideInvalidContentType(t *testing.T) {
	c := newClient(t, Config{})
	out := c.DoWith(t.Context(), Target{BaseURL: "http://127.0.0.1:1"}, newRequest(time.Minute),
		Overrides{Body: []byte("x"), ContentType: "text/plain\r\nX-Evil: 1"})
	if out.Class != Fatal || out.Err == nil || !strings.Contains(out.Err.Error(), "not a valid header value") {
		t.Fatalf("outcome: %+v", out)
	}
}

// BenchmarkHeaders is the header assembly alone: the fairness stamp and
// the overrides add no allocation.
func BenchmarkHeaders(b *testing.B) {
	req := benchRequest()
	callerFair := benchRequest()
	callerFair.Headers = map[string]string{"traceparent": req.Headers["traceparent"], "x-llm-d-inference-fairness-id": "caller"}
	prio := []Header{{"x-gateway-priority", "3"}}
	for _, bc := range []struct {
		name     string
		fairness FairnessConfig
		req      *wire.Request
		o        Overrides
	}{
		{"fairness off", FairnessConfig{Header: ptr("")}, req, Overrides{}},
		{"fairness on", FairnessConfig{}, req, Overrides{}},
		{"fairness on, caller header replaced", FairnessConfig{}, callerFair, Overrides{}},
		{"fairness on, priority and content type", FairnessConfig{}, req,
			Overrides{ContentType: "multipart/form-data; boundary=x", Headers: prio}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := New(Config{Fairness: bc.fairness})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			pt, err := c.target(Target{BaseURL: "http://127.0.0.1:1", InferenceObjective: "batch"})
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			c.headers(pt, bc.req, &bc.o, bc.req.Deadline, bc.req.Deadline, now) // warm the name cache
			b.ReportAllocs()
			for b.Loop() {
				h, _ := c.headers(pt, bc.req, &bc.o, bc.req.Deadline, bc.req.Deadline, now)
				if len(h) == 0 {
					b.Fatal("no headers")
				}
			}
		})
	}
}

// FuzzHeaders checks the header assembly's invariants for any message
// headers, fairness id and override: every name is canonical and every
// value valid; Content-Type, the deadline headers and a stamped fairness id
// are there exactly once and cannot be overridden by the message; an
// accepted override is there exactly once.
func FuzzHeaders(f *testing.F) {
	f.Add("x-llm-d-inference-fairness-id", "caller", "tenant-7", "x-gateway-priority", "3")
	f.Add("X-LLM-D-INFERENCE-FAIRNESS-ID", "a\r\nb", strings.Repeat("t", 257), "content-type", "text/plain")
	f.Add("content-type", "text/plain", "", "x-request-deadline", "1")
	f.Add("x-request-deadline", "1", "a\tb", "X-Llm-D-Inference-Fairness-Id", "o")
	c, err := New(Config{})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	pt, err := c.target(Target{BaseURL: "http://127.0.0.1:1", InferenceObjective: "batch"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, hk, hv, id, ok, ov string) {
		req := newRequest(time.Minute)
		req.Headers = map[string]string{hk: hv, "x-llm-d-inference-fairness-id": hv}
		req.Metadata = map[string]string{"userid": id}
		o := Overrides{Headers: []Header{{ok, ov}}}
		now := time.Now()
		h, _ := c.headers(pt, req, &o, req.Deadline, req.Deadline, now)
		for k, vs := range h {
			if k != http.CanonicalHeaderKey(k) || !validToken(k) {
				t.Fatalf("name %q", k)
			}
			for _, v := range vs {
				if !validValue(v) {
					t.Fatalf("%s: value %q", k, v)
				}
			}
		}
		once := func(k, want string) {
			t.Helper()
			if vs := h[k]; len(vs) != 1 || (want != "" && vs[0] != want) {
				t.Fatalf("%s = %q, want [%q]", k, vs, want)
			}
		}
		once("Content-Type", "application/json")
		once("X-Request-Deadline", "")
		once("X-Envoy-Upstream-Rq-Timeout-Ms", "")
		overridden := c.CheckHeaderName(ok) == nil && validValue(ov)
		if overridden {
			once(http.CanonicalHeaderKey(ok), ov)
		}
		if id != "" && len(id) <= MaxFairnessIDBytes && validValue(id) &&
			!(overridden && http.CanonicalHeaderKey(ok) == "X-Llm-D-Inference-Fairness-Id") {
			once("X-Llm-D-Inference-Fairness-Id", id)
		}
	})
}
