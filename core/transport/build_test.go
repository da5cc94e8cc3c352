package transport

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

type buildOptions struct {
	Size int    `json:"size"`
	Name string `json:"name,omitempty"`
}

// TestConstruct: options are decoded strictly into a fresh O and handed to
// build with the env; a decoding error stops before build.
func TestConstruct(t *testing.T) {
	env := Env{RedisMode: "single"}
	var got buildOptions
	var gotEnv Env
	build := func(o buildOptions, env Env) (*buildOptions, error) {
		got, gotEnv = o, env
		return &o, nil
	}
	o, err := Construct(json.RawMessage(`{"size":3}`), env, build)
	if err != nil || o == nil || o.Size != 3 || got.Size != 3 || gotEnv.RedisMode != "single" {
		t.Fatalf("Construct: %+v, %v (build saw %+v, %+v)", o, err, got, gotEnv)
	}
	got = buildOptions{Name: "untouched"}
	if _, err := Construct(json.RawMessage(`{"size":3,"sise":4}`), env, build); err == nil || !strings.Contains(err.Error(), `transport options: json: unknown field "sise"`) {
		t.Fatalf("unknown field: error %v", err)
	}
	if got.Name != "untouched" {
		t.Fatal("build ran after a decoding error")
	}
	if o, err := Construct(json.RawMessage(" "), env, build); err != nil || *o != (buildOptions{}) {
		t.Fatalf("empty options: %+v, %v; want the zero options", o, err)
	}
}

// TestBuildReturnsUntypedNil: a failing build's typed nil does not leak
// out of Build as a non-nil Transport.
func TestBuildReturnsUntypedNil(t *testing.T) {
	boom := errors.New("boom")
	tp, err := Build(nil, Env{}, func(buildOptions, Env) (*sourceTransport, error) { return nil, boom })
	if !errors.Is(err, boom) || tp != nil {
		t.Fatalf("Build: %v (%T), %v; want nil, boom", tp, tp, err)
	}
}
