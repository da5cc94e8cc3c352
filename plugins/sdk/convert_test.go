package sdk

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/gatepb"
)

// The two adapters' conversions are each other's inverse.

func TestDecisionRoundTrip(t *testing.T) {
	for _, d := range []gate.Decision{
		gate.Admitted,
		{Verdict: gate.Reject, Reason: "no"},
		{Verdict: gate.Defer, Delay: 250 * time.Millisecond, Reason: "wait"},
	} {
		pb, err := decisionToProto(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decisionFromProto(pb)
		if err != nil || got.Verdict != d.Verdict || got.Delay != d.Delay || got.Reason != d.Reason || got.Result != nil || got.Release != nil {
			t.Errorf("%+v round-tripped to %+v, %v", d, got, err)
		}
	}
	if got, err := decisionFromProto(&gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_DEFER, DelayMs: -5}); err != nil || got.Delay != 0 {
		t.Errorf("negative delay decoded as %+v, %v; want no delay", got, err)
	}
	if _, err := decisionToProto(gate.Decision{Verdict: 9}); err == nil {
		t.Error("unknown verdict encoded")
	}
	if _, err := decisionFromProto(&gatepb.AdmitResponse{Verdict: 9}); err == nil {
		t.Error("unknown verdict decoded")
	}
}

func TestRequestRoundTrip(t *testing.T) {
	full := &wire.Request{
		ID: "r", Deadline: time.UnixMilli(1_700_000_000_123), Created: time.UnixMilli(1_600_000_000_456),
		Payload: []byte(`{}`), Metadata: map[string]string{"a": "b"}, Headers: map[string]string{"H": "v"},
		Endpoint: "/e", RetryCount: 3,
	}
	got := requestFromProto(requestToProto(full))
	if got.ID != full.ID || !got.Deadline.Equal(full.Deadline) || !got.Created.Equal(full.Created) || got.Payload != nil ||
		got.Metadata["a"] != "b" || got.Headers["H"] != "v" || got.Endpoint != "/e" || got.RetryCount != 3 {
		t.Errorf("round-tripped to %+v", got)
	}
	// Unknown times stay unknown, rather than becoming the Unix epoch.
	if got := requestFromProto(requestToProto(&wire.Request{ID: "z"})); !got.Deadline.IsZero() || !got.Created.IsZero() {
		t.Errorf("zero times round-tripped to %v, %v", got.Deadline, got.Created)
	}
	if pb := requestToProto(&wire.Request{RetryCount: 1 << 40}); pb.GetRetryCount() != 1<<31-1 {
		t.Errorf("retry count 2^40 encoded as %d, want it capped", pb.GetRetryCount())
	}
}
