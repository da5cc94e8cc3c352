package host

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

// Decisions decode by protocol version: Wait exists from v2; a verdict the
// version does not define is an error, never a silent admit.
func TestDecisionFromProto(t *testing.T) {
	tests := []struct {
		name    string
		in      *gatepb.AdmitResponse
		version int
		want    gate.Decision
		wantErr string
	}{
		{"admit v1", &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, 1, gate.Admitted, ""},
		{"defer v1", &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_DEFER, DelayMs: 250, Reason: "later"}, 1,
			gate.Decision{Verdict: gate.Defer, Delay: 250 * time.Millisecond, Reason: "later"}, ""},
		{"negative delay", &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_DEFER, DelayMs: -5}, 2, gate.Decision{Verdict: gate.Defer}, ""},
		{"reject v2", &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_REJECT, Reason: "no"}, 2, gate.Decision{Verdict: gate.Reject, Reason: "no"}, ""},
		{"wait v2", &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_WAIT, DelayMs: 40, Reason: "full"}, 2,
			gate.Decision{Verdict: gate.Wait, Delay: 40 * time.Millisecond, Reason: "full"}, ""},
		{"wait is unknown in v1", &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_WAIT}, 1, gate.Decision{}, "unknown verdict 3 for protocol version 1"},
		{"unknown in v2", &gatepb.AdmitResponse{Verdict: 9}, 2, gate.Decision{}, "unknown verdict 9 for protocol version 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decisionFromProto(tt.in, tt.version)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("decision %+v, %v; want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.Verdict != tt.want.Verdict || got.Delay != tt.want.Delay || got.Reason != tt.want.Reason {
				t.Errorf("decision %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestRequestToProto(t *testing.T) {
	req := &wire.Request{
		ID: "r", Deadline: time.UnixMilli(1_700_000_000_123), Created: time.UnixMilli(1_600_000_000_456),
		Payload: []byte(`{"big":1}`), Metadata: map[string]string{"a": "b"}, Headers: map[string]string{"H": "v"},
		Endpoint: "/e", RetryCount: 1 << 40, Labels: map[string]string{"tier": "batch"},
	}
	v2 := requestToProto(req, 2)
	if v2.GetId() != "r" || v2.GetDeadlineUnixMs() != 1_700_000_000_123 || v2.GetCreatedUnixMs() != 1_600_000_000_456 ||
		v2.GetMetadata()["a"] != "b" || v2.GetHeaders()["H"] != "v" || v2.GetEndpoint() != "/e" ||
		v2.GetRetryCount() != 1<<31-1 || v2.GetLabels()["tier"] != "batch" {
		t.Errorf("v2 request %v", v2)
	}
	if v1 := requestToProto(req, 1); v1.GetLabels() != nil {
		t.Errorf("v1 request carries labels %v", v1.GetLabels())
	}
	if z := requestToProto(&wire.Request{ID: "z"}, 2); z.GetDeadlineUnixMs() != 0 || z.GetCreatedUnixMs() != 0 {
		t.Errorf("zero times encoded as %d, %d", z.GetDeadlineUnixMs(), z.GetCreatedUnixMs())
	}
}

func TestCallStats(t *testing.T) {
	var c callStats
	c.observe(80*time.Microsecond, false)
	c.observe(3*time.Millisecond, true)
	c.observe(time.Minute, false) // beyond the last bucket: counted in +Inf only
	s := c.snapshot("admit")
	if s.Call != "admit" || s.Count != 3 || s.Failures != 1 || s.Buckets[0.0001] != 1 || s.Buckets[0.005] != 2 || s.Buckets[10] != 2 {
		t.Errorf("snapshot %+v", s)
	}
	if s.Seconds < 60 || s.Seconds > 60.01 {
		t.Errorf("sum %v s", s.Seconds)
	}
}

func TestRateWriter(t *testing.T) {
	var out bytes.Buffer
	w := newRateWriter(&out, 3, "plugin.x")
	for range 10 {
		_, _ = w.Write([]byte("line\n"))
	}
	if n := strings.Count(out.String(), "line\n"); n != 3 {
		t.Errorf("%d lines passed, want 3", n)
	}
	if w.suppressedTotal() != 7 {
		t.Errorf("suppressed %d, want 7", w.suppressedTotal())
	}
	w.flush()
	if !strings.Contains(out.String(), "plugin.x: 7 plugin log lines suppressed (log_rate 3 lines/s)") {
		t.Errorf("no report of the suppressed lines in %q", out.String())
	}
	// A new window passes lines again.
	w.mu.Lock()
	w.window = w.window.Add(-time.Second)
	w.mu.Unlock()
	_, _ = w.Write([]byte("again\n"))
	if !strings.Contains(out.String(), "again\n") {
		t.Error("no line passed in the next second")
	}
	unlimited := newRateWriter(&out, 0, "plugin.y")
	for range 100 {
		_, _ = unlimited.Write([]byte("u\n"))
	}
	if unlimited.suppressedTotal() != 0 {
		t.Error("log_rate 0 suppressed lines")
	}
}

func TestMarkedErrors(t *testing.T) {
	err := callError("budget", errors.New("x"))
	if errors.Is(err, errUnavailable) || err.Error() != "budget: x" {
		t.Errorf("callError = %v", err)
	}
}
