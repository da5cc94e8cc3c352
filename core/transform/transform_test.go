package transform

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fake is a transform configured by its parameters:
// {"handle": bool, "fail": "validate"|"apply"|"", "ctype": string}.
// Every call is recorded in the shared log as "<name>.validate" or
// "<name>.apply".
type fake struct {
	name   string
	handle bool
	fail   string
	ctype  string
	log    *callLog
	closed *[]string
}

type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, s)
}

func (l *callLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.calls, " ")
}

func (f *fake) Validate(_ context.Context, payload []byte, _ map[string]string, _ time.Time) error {
	f.log.add(f.name + ".validate")
	if f.fail == "validate" {
		return errors.New("bad " + string(payload))
	}
	return nil
}

func (f *fake) Apply(_ context.Context, payload []byte, _ map[string]string) ([]byte, string, bool, error) {
	f.log.add(f.name + ".apply")
	if f.fail == "apply" {
		return nil, "", false, errors.New("cannot")
	}
	if !f.handle {
		return nil, "", false, nil
	}
	return []byte(f.name + ":" + string(payload)), f.ctype, true, nil
}

func (f *fake) Close() error {
	*f.closed = append(*f.closed, f.name)
	if f.fail == "close" {
		return errors.New("close failed")
	}
	return nil
}

// fakeRegistry registers "fake" (the transform above) and "broken" (a
// factory that fails).
func fakeRegistry(t *testing.T, log *callLog, closed *[]string) *Registry {
	t.Helper()
	r := NewRegistry()
	err := errors.Join(
		r.Register("fake", func(params json.RawMessage, env Env) (Transform, error) {
			var p struct {
				Handle bool   `json:"handle"`
				Fail   string `json:"fail"`
				CType  string `json:"ctype"`
			}
			if len(params) > 0 {
				if err := json.Unmarshal(params, &p); err != nil {
					return nil, err
				}
			}
			if env.Logger == nil {
				return nil, errors.New("no logger")
			}
			if p.CType == "" {
				p.CType = "text/x-" + env.Name
			}
			return &fake{name: env.Name, handle: p.Handle, fail: p.Fail, ctype: p.CType, log: log, closed: closed}, nil
		}),
		r.Register("broken", func(json.RawMessage, Env) (Transform, error) {
			return nil, errors.New("no luck")
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		want    []string // name/type of each entry
		wantErr []string // each must appear in the error
	}{
		{name: "one", data: `{"requestTransforms":[{"name":"a","type":"fake","parameters":{"x":1}}]}`, want: []string{"a/fake"}},
		{name: "two, no parameters", data: `{"requestTransforms":[{"name":"a","type":"fake"},{"name":"b","type":"fake"}]}`,
			want: []string{"a/fake", "b/fake"}},
		{name: "empty array", data: `{"requestTransforms":[]}`},
		{name: "absent array", data: `{}`},
		{name: "null", data: `null`},
		{name: "trailing space", data: "{\"requestTransforms\":[]}\n\n"},
		{name: "empty file", data: "", wantErr: []string{"no JSON value"}},
		{name: "not JSON", data: `{"requestTransforms":[`, wantErr: []string{"unexpected EOF"}},
		{name: "not an object", data: `[]`, wantErr: []string{"cannot unmarshal array"}},
		{name: "array not an array", data: `{"requestTransforms":{}}`, wantErr: []string{"cannot unmarshal object"}},
		{name: "data after the value", data: `{"requestTransforms":[]} {}`, wantErr: []string{"data after the JSON value"}},
		{name: "unknown top-level key", data: `{"requestTransforms":[],"responseTransforms":[]}`,
			wantErr: []string{`unknown field "responseTransforms"`}},
		{name: "unknown entry key", data: `{"requestTransforms":[{"name":"a","type":"fake"},{"name":"b","type":"fake","params":{}}]}`,
			wantErr: []string{`requestTransforms[1]: json: unknown field "params"`}},
		{name: "entry not an object", data: `{"requestTransforms":["a"]}`,
			wantErr: []string{"requestTransforms[0]: json: cannot unmarshal string"}},
		{name: "name not a string", data: `{"requestTransforms":[{"name":1,"type":"fake"}]}`,
			wantErr: []string{"requestTransforms[0]: json: cannot unmarshal number", "name"}},
		{name: "empty name", data: `{"requestTransforms":[{"name":"","type":"fake"}]}`,
			wantErr: []string{"requestTransforms[0]: name is empty"}},
		{name: "missing name", data: `{"requestTransforms":[{"type":"fake"}]}`,
			wantErr: []string{"requestTransforms[0]: name is empty"}},
		{name: "duplicate name", data: `{"requestTransforms":[{"name":"a","type":"fake"},{"name":"b","type":"fake"},{"name":"a","type":"fake"}]}`,
			wantErr: []string{`requestTransforms[2] "a": name is already used by requestTransforms[0]`}},
		{name: "empty type", data: `{"requestTransforms":[{"name":"a","type":""}]}`,
			wantErr: []string{`requestTransforms[0] "a": type is empty`}},
		{name: "every error reported", data: `{"requestTransforms":[{"name":"","type":"fake"},{"name":"b"}]}`,
			wantErr: []string{"requestTransforms[0]: name is empty", `requestTransforms[1] "b": type is empty`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.data))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Parse = %+v, want an error", cfg)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var got []string
			for _, e := range cfg.RequestTransforms {
				got = append(got, e.Name+"/"+e.Type)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("entries = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseKeepsParameters(t *testing.T) {
	cfg, err := Parse([]byte(`{"requestTransforms":[{"name":"a","type":"fake","parameters":{"providers":["w"]}},{"name":"b","type":"fake"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(cfg.RequestTransforms[0].Parameters); got != `{"providers":["w"]}` {
		t.Errorf("parameters = %s", got)
	}
	if cfg.RequestTransforms[1].Parameters != nil {
		t.Errorf("absent parameters = %s, want nil", cfg.RequestTransforms[1].Parameters)
	}
}

func TestNewChainErrors(t *testing.T) {
	var log callLog
	var closed []string
	r := fakeRegistry(t, &log, &closed)
	cfg, err := Parse([]byte(`{"requestTransforms":[
		{"name":"ok","type":"fake"},
		{"name":"x","type":"random-robin"},
		{"name":"y","type":"broken"},
		{"name":"z","type":"fake","parameters":[1]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(cfg, r, Env{})
	if err == nil {
		t.Fatalf("NewChain = %v, want an error", c)
	}
	for _, w := range []string{
		`requestTransforms[1] "x": unknown transform type "random-robin" (known: broken, fake)`,
		`requestTransforms[2] "y": broken: no luck`,
		`requestTransforms[3] "z": fake: json: cannot unmarshal array`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	if strings.Join(closed, ",") != "ok" {
		t.Errorf("closed %v, want the transform built before the error", closed)
	}
	// NewChain validates a Config it is given directly.
	if _, err := NewChain(Config{RequestTransforms: []Entry{{Name: "a", Type: "fake"}, {Name: "a", Type: "fake"}}}, r, Env{}); err == nil ||
		!strings.Contains(err.Error(), "already used") {
		t.Errorf("duplicate names: %v", err)
	}
}

func TestLoad(t *testing.T) {
	var log callLog
	var closed []string
	r := fakeRegistry(t, &log, &closed)
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	c, err := Load("", r, Env{})
	if err != nil || c == nil || c.Len() != 0 {
		t.Fatalf("Load(\"\") = %v, %v; want an empty chain", c, err)
	}
	good := write("good.json", `{"requestTransforms":[{"name":"a","type":"fake"},{"name":"b","type":"fake","parameters":{"handle":true}}]}`)
	if c, err = Load(good, r, Env{}); err != nil || c.Len() != 2 {
		t.Fatalf("Load = %v, %v", c, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.json"), r, Env{}); err == nil || !strings.Contains(err.Error(), "transform config: open ") {
		t.Errorf("missing file: %v", err)
	}
	bad := write("bad.json", `{"requestTransforms":[{"name":"a","type":"fake","extra":1}]}`)
	if _, err := Load(bad, r, Env{}); err == nil || !strings.Contains(err.Error(), "transform config "+bad+": requestTransforms[0]") {
		t.Errorf("bad file: %v", err)
	}
	unknown := write("unknown.json", `{"requestTransforms":[{"name":"a","type":"nope"}]}`)
	if _, err := Load(unknown, r, Env{}); err == nil || !strings.Contains(err.Error(), "transform config "+unknown+`: requestTransforms[0] "a": unknown transform type "nope"`) {
		t.Errorf("unknown type: %v", err)
	}
}

// newChain builds a chain of fakes from their parameters, in order.
func newChain(t *testing.T, log *callLog, closed *[]string, entries ...string) *Chain {
	t.Helper()
	cfg, err := Parse([]byte(`{"requestTransforms":[` + strings.Join(entries, ",") + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(cfg, fakeRegistry(t, log, closed), Env{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestChainValidate(t *testing.T) {
	ctx := context.Background()
	md := map[string]string{"provider": "p"}
	t.Run("all run in order", func(t *testing.T) {
		var log callLog
		c := newChain(t, &log, new([]string), `{"name":"a","type":"fake"}`, `{"name":"b","type":"fake"}`, `{"name":"c","type":"fake"}`)
		if err := c.Validate(ctx, []byte("{}"), md, time.Now()); err != nil {
			t.Fatal(err)
		}
		if got := log.String(); got != "a.validate b.validate c.validate" {
			t.Errorf("calls = %q", got)
		}
	})
	t.Run("first error wins, prefixed", func(t *testing.T) {
		var log callLog
		c := newChain(t, &log, new([]string), `{"name":"a","type":"fake"}`,
			`{"name":"b","type":"fake","parameters":{"fail":"validate"}}`,
			`{"name":"c","type":"fake","parameters":{"fail":"validate"}}`)
		err := c.Validate(ctx, []byte("{}"), md, time.Now())
		if err == nil || err.Error() != "transform b/fake: bad {}" {
			t.Fatalf("Validate = %v", err)
		}
		if got := log.String(); got != "a.validate b.validate" {
			t.Errorf("calls = %q", got)
		}
	})
}

func TestChainApply(t *testing.T) {
	ctx := context.Background()
	payload := []byte(`{"p":1}`)
	tests := []struct {
		name      string
		entries   []string
		wantBody  string
		wantCType string
		handled   bool
		wantErr   string
		wantCalls string
	}{
		{name: "none handles: the payload itself",
			entries:  []string{`{"name":"a","type":"fake"}`, `{"name":"b","type":"fake"}`},
			wantBody: `{"p":1}`, wantCalls: "a.apply b.apply"},
		{name: "first handler wins",
			entries: []string{`{"name":"a","type":"fake"}`, `{"name":"b","type":"fake","parameters":{"handle":true}}`,
				`{"name":"c","type":"fake","parameters":{"handle":true}}`},
			wantBody: `b:{"p":1}`, wantCType: "text/x-b", handled: true, wantCalls: "a.apply b.apply"},
		{name: "error stops the chain",
			entries: []string{`{"name":"a","type":"fake","parameters":{"fail":"apply"}}`,
				`{"name":"b","type":"fake","parameters":{"handle":true}}`},
			wantErr: "transform a/fake: cannot", wantCalls: "a.apply"},
		{name: "handled with an invalid content type",
			entries: []string{`{"name":"a","type":"fake","parameters":{"handle":true,"ctype":"text/plain\r\nX: 1"}}`},
			wantErr: `transform a/fake: handled the body with content type "text/plain\r\nX: 1", not a valid header value`, wantCalls: "a.apply"},
		{name: "empty chain", wantBody: `{"p":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log callLog
			c := newChain(t, &log, new([]string), tt.entries...)
			body, ct, handled, err := c.Apply(ctx, payload, nil)
			if got := log.String(); got != tt.wantCalls {
				t.Errorf("calls = %q, want %q", got, tt.wantCalls)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Apply = %q, %q, %v, %v; want error %q", body, ct, handled, err, tt.wantErr)
				}
				if body != nil || handled {
					t.Errorf("error with body %q, handled %v", body, handled)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(body) != tt.wantBody || ct != tt.wantCType || handled != tt.handled {
				t.Errorf("Apply = %q, %q, %v; want %q, %q, %v", body, ct, handled, tt.wantBody, tt.wantCType, tt.handled)
			}
		})
	}
}

// A transform that handles a body must give its content type.
func TestChainApplyEmptyContentType(t *testing.T) {
	r := NewRegistry()
	if err := r.Register("empty", func(json.RawMessage, Env) (Transform, error) { return emptyCT{}, nil }); err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(Config{RequestTransforms: []Entry{{Name: "e", Type: "empty"}}}, r, Env{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Apply(context.Background(), []byte("{}"), nil); err == nil ||
		err.Error() != `transform e/empty: handled the body with content type "", not a valid header value` {
		t.Errorf("Apply = %v", err)
	}
}

type emptyCT struct{}

func (emptyCT) Validate(context.Context, []byte, map[string]string, time.Time) error { return nil }
func (emptyCT) Apply(context.Context, []byte, map[string]string) ([]byte, string, bool, error) {
	return []byte("x"), "", true, nil
}

func TestNilChain(t *testing.T) {
	var c *Chain
	payload := []byte("{}")
	if err := c.Validate(context.Background(), payload, nil, time.Now()); err != nil {
		t.Errorf("Validate: %v", err)
	}
	body, ct, handled, err := c.Apply(context.Background(), payload, nil)
	if string(body) != "{}" || ct != "" || handled || err != nil {
		t.Errorf("Apply = %q, %q, %v, %v", body, ct, handled, err)
	}
	if c.Len() != 0 || c.Close() != nil {
		t.Errorf("Len %d, Close %v", c.Len(), c.Close())
	}
}

func TestChainClose(t *testing.T) {
	var log callLog
	var closed []string
	c := newChain(t, &log, &closed, `{"name":"a","type":"fake","parameters":{"fail":"close"}}`, `{"name":"b","type":"fake"}`)
	err := c.Close()
	if strings.Join(closed, ",") != "b,a" {
		t.Errorf("closed %v, want b,a", closed)
	}
	if err == nil || err.Error() != "transform a/fake: close failed" {
		t.Errorf("Close = %v", err)
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	if r.Namespace() != "transform type" {
		t.Errorf("namespace %q", r.Namespace())
	}
	if err := r.Register("nil", func(json.RawMessage, Env) (Transform, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := r.New("nil", nil, Env{}); err == nil || err.Error() != "nil: factory returned no transform" {
		t.Errorf("New(nil) = %v", err)
	}
	if _, err := r.New("nope", nil, Env{}); err == nil || !strings.Contains(err.Error(), `unknown transform type "nope"`) {
		t.Errorf("New(nope) = %v", err)
	}
	if err := r.Register("nil", func(json.RawMessage, Env) (Transform, error) { return nil, nil }); err == nil {
		t.Error("duplicate type registered")
	}
}
