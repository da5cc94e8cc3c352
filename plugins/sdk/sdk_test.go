package sdk_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	gatepb "github.com/sluice-io/sluice/plugins/gatepb"
	"github.com/sluice-io/sluice/plugins/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// probe records what crosses the boundary.
type probe struct {
	mu       sync.Mutex
	level    float64
	budget   error
	deadline time.Time
	req      *wire.Request
}

func (p *probe) Configure(params gate.Params) error {
	l, err := params.Float("level", 1)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.level = l
	p.mu.Unlock()
	return nil
}

func (p *probe) Budget(ctx context.Context) (float64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deadline, _ = ctx.Deadline()
	return p.level, p.budget
}

func (p *probe) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	p.mu.Lock()
	p.req = req
	p.mu.Unlock()
	if req.Metadata["hang"] != "" {
		<-ctx.Done()
		return gate.Decision{}, ctx.Err()
	}
	return gate.Decision{Verdict: gate.Defer, Delay: 1500 * time.Millisecond, Reason: "later"}, nil
}

// dial serves impl over go-plugin's in-memory gRPC connection.
func dial(t *testing.T, impl gate.Gate) gatepb.GateClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, sdk.PluginSet(impl))
	t.Cleanup(func() { _ = client.Close() }) // also shuts the server down
	raw, err := client.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(gatepb.GateClient)
}

func TestConfigure(t *testing.T) {
	tests := []struct {
		name    string
		impl    gate.Gate
		params  map[string]string
		wantErr string
	}{
		{"known", &probe{}, map[string]string{"level": "0.5"}, ""},
		{"unknown reported", &probe{}, map[string]string{"level": "0.5", "x": "1", "y": "2"}, "unknown gate_params: x, y"},
		{"invalid", &probe{}, map[string]string{"level": "high"}, "not a number"},
		{"no Configurer takes nothing", gateFunc(nil), map[string]string{"level": "1"}, "unknown gate_params: level"},
		{"no Configurer, no params", gateFunc(nil), nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, tt.impl)
			resp, err := c.Configure(context.Background(), &gatepb.ConfigureRequest{Params: tt.params})
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantErr == "" && resp.GetError() != "" || !strings.Contains(resp.GetError(), tt.wantErr) {
				t.Errorf("Configure error %q, want %q", resp.GetError(), tt.wantErr)
			}
			_, admitter := tt.impl.(gate.Admitter)
			if resp.GetAdmitter() != admitter {
				t.Errorf("admitter = %v, want %v", resp.GetAdmitter(), admitter)
			}
		})
	}
}

type gateFunc func(context.Context) (float64, error)

func (f gateFunc) Budget(ctx context.Context) (float64, error) {
	if f == nil {
		return 1, nil
	}
	return f(ctx)
}

func TestBudgetAcrossTheBoundary(t *testing.T) {
	p := &probe{}
	c := dial(t, p)
	if _, err := c.Configure(context.Background(), &gatepb.ConfigureRequest{Params: map[string]string{"level": "0.25"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := c.Budget(ctx, &gatepb.BudgetRequest{})
	if err != nil || resp.GetBudget() != 0.25 || resp.GetFallback() != "" {
		t.Fatalf("Budget = %v, %v", resp, err)
	}
	p.mu.Lock()
	got := p.deadline
	p.mu.Unlock()
	// gRPC sends the deadline as a timeout: allow for the time in transit
	// and the timeout's rounding.
	if got.IsZero() || got.Sub(deadline).Abs() > 100*time.Millisecond {
		t.Errorf("plugin saw deadline %v, caller's was %v", got, deadline)
	}

	tests := []struct {
		err      error
		code     codes.Code
		fallback string
	}{
		{errors.New("backend down"), codes.Unknown, ""},
		{context.DeadlineExceeded, codes.DeadlineExceeded, ""},
		{&gate.FallbackError{Budget: 0.25, Err: errors.New("stale")}, codes.OK, "stale"},
	}
	for _, tt := range tests {
		p.mu.Lock()
		p.budget = tt.err
		p.mu.Unlock()
		resp, err := c.Budget(context.Background(), &gatepb.BudgetRequest{})
		if status.Code(err) != tt.code || resp.GetFallback() != tt.fallback {
			t.Errorf("%v: Budget = %v, %v; want code %v fallback %q", tt.err, resp, err, tt.code, tt.fallback)
		}
	}
}

func TestAdmitAcrossTheBoundary(t *testing.T) {
	p := &probe{}
	c := dial(t, p)
	deadline := time.UnixMilli(time.Now().Add(time.Minute).UnixMilli())
	created := time.UnixMilli(time.Now().UnixMilli())
	in := &wire.Request{
		ID: "r1", Deadline: deadline, Created: created, Payload: []byte(`{"big":"payload"}`),
		Metadata: map[string]string{"job_id": "j"}, Headers: map[string]string{"X-Tenant": "t"}, Endpoint: "/v1/x", RetryCount: 2,
	}
	resp, err := c.Admit(context.Background(), sdk.RequestToProto(in))
	if err != nil {
		t.Fatal(err)
	}
	d, err := sdk.DecisionFromProto(resp)
	if err != nil || d != (gate.Decision{Verdict: gate.Defer, Delay: 1500 * time.Millisecond, Reason: "later"}) {
		t.Errorf("decision %+v, %v", d, err)
	}
	p.mu.Lock()
	got := p.req
	p.mu.Unlock()
	if got.ID != "r1" || !got.Deadline.Equal(deadline) || !got.Created.Equal(created) || got.Payload != nil ||
		got.Metadata["job_id"] != "j" || got.Headers["X-Tenant"] != "t" || got.Endpoint != "/v1/x" || got.RetryCount != 2 {
		t.Errorf("plugin saw %+v", got)
	}

	// A hanging Admit ends with the caller's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Admit(ctx, &gatepb.AdmitRequest{Id: "h", Metadata: map[string]string{"hang": "1"}})
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > time.Second {
		t.Errorf("hanging Admit = %v after %v", err, time.Since(start))
	}

	// A gate without Admit admits everything.
	resp, err = dial(t, gateFunc(nil)).Admit(context.Background(), &gatepb.AdmitRequest{Id: "x"})
	if err != nil || resp.GetVerdict() != gatepb.Verdict_VERDICT_ADMIT {
		t.Errorf("Admit on a budget-only gate = %v, %v", resp, err)
	}
}

func TestDecisionRoundTrip(t *testing.T) {
	for _, d := range []gate.Decision{
		gate.Admitted,
		{Verdict: gate.Reject, Reason: "no"},
		{Verdict: gate.Defer, Delay: 250 * time.Millisecond, Reason: "wait"},
	} {
		pb, err := sdk.DecisionToProto(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sdk.DecisionFromProto(pb)
		if err != nil || got != d {
			t.Errorf("%+v round-tripped to %+v, %v", d, got, err)
		}
	}
	if _, err := sdk.DecisionToProto(gate.Decision{Verdict: 9}); err == nil {
		t.Error("unknown verdict encoded")
	}
	if _, err := sdk.DecisionFromProto(&gatepb.AdmitResponse{Verdict: 9}); err == nil {
		t.Error("unknown verdict decoded")
	}
}
