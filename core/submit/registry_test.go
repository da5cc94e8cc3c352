package submit_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
)

// A producer factory that fails with its options as the error, and
// refuses "bad" options in its check.
var echoFactory = submit.Factory{
	New: func(options json.RawMessage, env transport.Env) (submit.Producer, transport.Transport, error) {
		if env.Logger == nil {
			return nil, nil, errors.New("no logger")
		}
		return nil, nil, errors.New(string(options))
	},
	Check: func(options json.RawMessage) error {
		if string(options) == "bad" {
			return errors.New("bad options")
		}
		return nil
	},
}

func TestRegistry(t *testing.T) {
	r := submit.NewRegistry()
	if err := r.Register("a", echoFactory); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("b", submit.Factory{New: echoFactory.New}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil New", r.Register("c", submit.Factory{Check: echoFactory.Check}), `register transport producer "c": nil factory`},
		{"duplicate", r.Register("a", echoFactory), `register transport producer "a": already registered`},
		{"unknown", func() error { _, _, err := r.New("kafka", nil, transport.Env{}); return err }(), `unknown transport producer "kafka" (known: a, b)`},
		{"New's error, wrapped, with a logger", func() error { _, _, err := r.New("a", json.RawMessage("boom"), transport.Env{}); return err }(), "a producer: boom"},
		{"Check", r.Check("a", json.RawMessage("bad")), "bad options"},
		{"Check of an unknown transport", r.Check("kafka", nil), `unknown transport producer "kafka"`},
	} {
		if tc.err == nil || tc.err.Error() != tc.want && !strings.HasPrefix(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, tc.err, tc.want)
		}
	}
	if err := r.Check("a", json.RawMessage("good")); err != nil {
		t.Errorf("Check of good options: %v", err)
	}
	if err := r.Check("b", json.RawMessage("bad")); err != nil {
		t.Errorf("Check without a checker: %v", err)
	}
	if !r.Has("a") || r.Has("c") {
		t.Errorf("Has: a %v, c %v", r.Has("a"), r.Has("c"))
	}
}
