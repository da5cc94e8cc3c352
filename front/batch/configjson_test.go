package batch_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/front/batch"
)

// Config reads its json keys, durations as the rest of a sluice config
// (a Go duration or a number of seconds), and leaves other keys (the
// batch_api section's own) to its reader; absent keys keep their values.
func TestConfigJSON(t *testing.T) {
	c := batch.Config{Queue: "kept", MaxLines: 7}
	doc := `{"enabled": true, "route_prefix": "b:", "owner_lease": "45s", "cancel_quiet": 0.25, "chunk_size": 10,
	  "completion_windows": ["1h"], "record_wait": "5ms", "files": {"store": "disk"}}`
	if err := json.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	want := batch.Config{Queue: "kept", MaxLines: 7, RoutePrefix: "b:", OwnerLease: 45 * time.Second,
		CancelQuiet: 250 * time.Millisecond, ChunkSize: 10, Windows: []string{"1h"}, RecordWait: 5 * time.Millisecond}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
	for doc, msg := range map[string]string{
		`{"owner_lease": "soon"}`: `owner_lease: "soon" is not a duration`,
		`{"max_lines": "many"}`:   "max_lines",
		`[1]`:                     "cannot unmarshal array",
	} {
		var c batch.Config
		if err := json.Unmarshal([]byte(doc), &c); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %q", doc, err, msg)
		}
	}
}

// Validate refuses negative settings (zero takes the default) and
// reports every problem, each naming the component.
func TestConfigValidate(t *testing.T) {
	c := batch.Config{MaxLines: -1, CancelWait: -time.Second, Windows: []string{"1d"}}
	err := c.Validate()
	for _, want := range []string{"batch: max_lines -1 is negative", "batch: cancel_wait -1s is negative",
		`batch: completion window "1d" is not a positive duration`, "batch: queue is empty"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want %q", err, want)
		}
	}
	ok := batch.Config{Queue: "q"}
	if err := ok.Validate(); err != nil || ok.ScanInterval != time.Second || ok.RecordWait != 20*time.Millisecond || ok.FileExpiry != 30*24*time.Hour {
		t.Errorf("defaults: %+v, %v", ok, err)
	}
}
