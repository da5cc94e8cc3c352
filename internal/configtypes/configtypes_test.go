package configtypes

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDurationJSON(t *testing.T) {
	for in, want := range map[string]time.Duration{
		`"250ms"`: 250 * time.Millisecond,
		`"5m"`:    5 * time.Minute,
		`1.5`:     1500 * time.Millisecond,
		` 30 `:    30 * time.Second,
		`0`:       0,
	} {
		var d Duration
		if err := json.Unmarshal([]byte(in), &d); err != nil || d.D() != want {
			t.Errorf("%s: %v, %v; want %v", in, d.D(), err, want)
		}
	}
	for in, want := range map[string]string{
		`"soon"`: `"soon" is not a duration (use e.g. "250ms", "5m")`,
		`true`:   `true is not a duration`,
	} {
		var d Duration
		if err := json.Unmarshal([]byte(in), &d); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
	b, err := json.Marshal(struct{ T Duration }{Duration(90 * time.Second)})
	if err != nil || string(b) != `{"T":"1m30s"}` {
		t.Errorf("marshal: %s, %v", b, err)
	}
}
