package sdk_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/plugins/sdk"
)

func TestParams(t *testing.T) {
	p := sdk.NewParams(map[string]string{"f": "0.5", "i": "3", "d": "250ms", "ds": "1.5", "b": "yes", "s": "x", "e": "", "bad": "zz"})
	if v, err := p.Float("f", 0); err != nil || v != 0.5 {
		t.Errorf("Float = %v, %v", v, err)
	}
	if v, err := p.Int("i", 0); err != nil || v != 3 {
		t.Errorf("Int = %v, %v", v, err)
	}
	if v, err := p.Duration("d", 0); err != nil || v != 250*time.Millisecond {
		t.Errorf("Duration = %v, %v", v, err)
	}
	if v, err := p.Duration("ds", 0); err != nil || v != 1500*time.Millisecond {
		t.Errorf("Duration of seconds = %v, %v", v, err)
	}
	if v, err := p.Bool("b", false); err != nil || !v {
		t.Errorf("Bool = %v, %v", v, err)
	}
	if v := p.String("e", "def"); v != "def" {
		t.Errorf("empty String = %q, want the default", v)
	}
	if v, err := p.Float("missing", 7); err != nil || v != 7 {
		t.Errorf("absent Float = %v, %v", v, err)
	}
	if err := p.Unused(); err == nil || err.Error() != "unknown gate_params: bad, s" {
		t.Errorf("Unused = %v", err)
	}
	for name, read := range map[string]func() error{
		"Float":    func() error { _, err := p.Float("bad", 0); return err },
		"Int":      func() error { _, err := p.Int("f", 0); return err },
		"Bool":     func() error { _, err := p.Bool("bad", false); return err },
		"Duration": func() error { _, err := p.Duration("bad", 0); return err },
	} {
		if err := read(); err == nil || !strings.HasPrefix(err.Error(), "gate_params.") {
			t.Errorf("%s of a bad value = %v, want an error naming the parameter", name, err)
		}
	}
	if p.Has("nope") || !p.Has("s") {
		t.Error("Has")
	}
}
