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

	"github.com/sluice-io/sluice/plugins/sdk"
	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// probe records what crosses the boundary.
type probe struct {
	mu       sync.Mutex
	level    float64
	budget   error
	deadline time.Time
	req      *sdk.Request
	decision sdk.Decision
}

func (p *probe) Configure(params sdk.Params) error {
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

func (p *probe) Admit(ctx context.Context, req *sdk.Request) (sdk.Decision, error) {
	p.mu.Lock()
	p.req = req
	d := p.decision
	p.mu.Unlock()
	if req.Metadata["hang"] != "" {
		<-ctx.Done()
		return sdk.Decision{}, ctx.Err()
	}
	if req.Metadata["fail"] != "" {
		return sdk.Decision{}, errors.New("quota store down")
	}
	if t := req.Label("tier"); t != "" {
		req.SetLabel("classification", "overflow")
		req.SetLabel("tier", "")
	}
	return d, nil
}

func (p *probe) Describe() string { return "when probed" }

type gateFunc func(context.Context) (float64, error)

func (f gateFunc) Budget(ctx context.Context) (float64, error) {
	if f == nil {
		return 1, nil
	}
	return f(ctx)
}

// dial serves impl at protocol version over go-plugin's in-memory gRPC
// connection, and returns the raw client the host dispenses.
func dial(t *testing.T, impl sdk.Gate, version int) gatepb.GateClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, sdk.ServerPlugins(impl)[version])
	t.Cleanup(func() { _ = client.Close() }) // also shuts the server down
	raw, err := client.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := raw.(gatepb.GateClient)
	if !ok {
		t.Fatalf("Dispense returned %T, not a gatepb.GateClient", raw)
	}
	return c
}

func TestConfigure(t *testing.T) {
	tests := []struct {
		name    string
		impl    sdk.Gate
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
			c := dial(t, tt.impl, sdk.ProtocolLatest)
			// A refusal is an answer, not a gRPC error.
			resp, err := c.Configure(context.Background(), &gatepb.ConfigureRequest{Params: tt.params})
			if err != nil {
				t.Fatalf("Configure: %v", err)
			}
			_, want := tt.impl.(sdk.Admitter)
			if resp.GetAdmitter() != want {
				t.Errorf("admitter = %v, want %v", resp.GetAdmitter(), want)
			}
			if tt.wantErr == "" {
				if resp.GetError() != "" {
					t.Fatalf("Configure refused: %s", resp.GetError())
				}
				// Configure is once per process.
				if resp, err := c.Configure(context.Background(), &gatepb.ConfigureRequest{Params: tt.params}); err != nil || resp.GetError() != "configured twice" {
					t.Errorf("second Configure = %v, %v; want a refusal", resp, err)
				}
				return
			}
			if !strings.Contains(resp.GetError(), tt.wantErr) {
				t.Errorf("Configure error %q, want one containing %q", resp.GetError(), tt.wantErr)
			}
		})
	}
}

func TestBudget(t *testing.T) {
	p := &probe{level: 0.25}
	c := dial(t, p, sdk.ProtocolLatest)
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
	// gRPC sends the deadline as a timeout: allow for the time in transit.
	if got.IsZero() || got.Sub(deadline).Abs() > 100*time.Millisecond {
		t.Errorf("plugin saw deadline %v, caller's was %v", got, deadline)
	}
	tests := []struct {
		name     string
		err      error
		code     codes.Code
		fallback string
	}{
		{"failure", errors.New("backend down"), codes.Unknown, ""},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded, ""},
		{"canceled", context.Canceled, codes.Canceled, ""},
		{"fallback", &sdk.FallbackError{Budget: 0.5, Err: errors.New("stale")}, codes.OK, "stale"},
		{"fallback without cause", &sdk.FallbackError{Budget: 0.5}, codes.OK, "fallback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.set(0.25, tt.err)
			resp, err := c.Budget(context.Background(), &gatepb.BudgetRequest{})
			if status.Code(err) != tt.code {
				t.Fatalf("Budget = %v, %v; want code %v", resp, err, tt.code)
			}
			if tt.fallback != "" && (resp.GetBudget() != 0.5 || resp.GetFallback() != tt.fallback) {
				t.Errorf("Budget = %v; want a fallback to 0.5 because %q", resp, tt.fallback)
			}
		})
	}
}

func (p *probe) set(level float64, err error) {
	p.mu.Lock()
	p.level, p.budget = level, err
	p.mu.Unlock()
}

func TestAdmit(t *testing.T) {
	deadline := time.UnixMilli(time.Now().Add(time.Minute).UnixMilli())
	created := time.UnixMilli(time.Now().UnixMilli())
	in := &gatepb.AdmitRequest{
		Id: "r1", DeadlineUnixMs: deadline.UnixMilli(), CreatedUnixMs: created.UnixMilli(),
		Metadata: map[string]string{"job_id": "j"}, Headers: map[string]string{"X-Tenant": "t"}, Endpoint: "/v1/x", RetryCount: 2,
		Labels: map[string]string{"tier": "batch", "keep": "1"},
	}
	tests := []struct {
		name       string
		version    int
		decision   sdk.Decision
		want       *gatepb.AdmitResponse
		wantCode   codes.Code
		wantLabels map[string]string
	}{
		{"admit", 2, sdk.Admitted, &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, codes.OK, map[string]string{"classification": "overflow", "tier": ""}},
		{"defer", 2, sdk.Decision{Verdict: sdk.Defer, Delay: 1500 * time.Millisecond, Reason: "later"},
			&gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_DEFER, DelayMs: 1500, Reason: "later"}, codes.OK, map[string]string{"classification": "overflow", "tier": ""}},
		{"negative delay", 2, sdk.Decision{Verdict: sdk.Defer, Delay: -time.Second},
			&gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_DEFER}, codes.OK, map[string]string{"classification": "overflow", "tier": ""}},
		{"reject", 2, sdk.Decision{Verdict: sdk.Reject, Reason: "no"},
			&gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_REJECT, Reason: "no"}, codes.OK, map[string]string{"classification": "overflow", "tier": ""}},
		{"wait", 2, sdk.Decision{Verdict: sdk.Wait, Delay: 200 * time.Millisecond, Reason: "full"},
			&gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_WAIT, DelayMs: 200, Reason: "full"}, codes.OK, map[string]string{"classification": "overflow", "tier": ""}},
		{"unknown verdict", 2, sdk.Decision{Verdict: 9}, nil, codes.Internal, nil},
		// Protocol v1 has neither labels nor Wait.
		{"v1 admit drops labels", 1, sdk.Admitted, &gatepb.AdmitResponse{Verdict: gatepb.Verdict_VERDICT_ADMIT}, codes.OK, nil},
		{"v1 wait refused", 1, sdk.Decision{Verdict: sdk.Wait}, nil, codes.Unimplemented, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &probe{decision: tt.decision}
			resp, err := dial(t, p, tt.version).Admit(context.Background(), in)
			if status.Code(err) != tt.wantCode {
				t.Fatalf("Admit = %v, %v; want code %v", resp, err, tt.wantCode)
			}
			if err == nil && (resp.GetVerdict() != tt.want.GetVerdict() || resp.GetDelayMs() != tt.want.GetDelayMs() ||
				resp.GetReason() != tt.want.GetReason() || !equal(resp.GetLabels(), tt.wantLabels)) {
				t.Errorf("Admit = %v, want %v with labels %v", resp, tt.want, tt.wantLabels)
			}
			p.mu.Lock()
			got := p.req
			p.mu.Unlock()
			if got.ID != "r1" || !got.Deadline.Equal(deadline) || !got.Created.Equal(created) ||
				got.Metadata["job_id"] != "j" || got.Headers["X-Tenant"] != "t" || got.Endpoint != "/v1/x" || got.RetryCount != 2 {
				t.Errorf("plugin saw %+v", got)
			}
		})
	}

	c := dial(t, &probe{}, sdk.ProtocolLatest)
	// A gate error travels as codes.Unknown.
	if _, err := c.Admit(context.Background(), &gatepb.AdmitRequest{Id: "f", Metadata: map[string]string{"fail": "1"}}); status.Code(err) != codes.Unknown ||
		!strings.Contains(err.Error(), "quota store down") {
		t.Errorf("failing Admit = %v", err)
	}
	// A hanging Admit ends with the caller's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Admit(ctx, &gatepb.AdmitRequest{Id: "h", Metadata: map[string]string{"hang": "1"}})
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > time.Second {
		t.Errorf("hanging Admit = %v after %v", err, time.Since(start))
	}
	// A gate without Admit admits everything.
	resp, err := dial(t, gateFunc(nil), sdk.ProtocolLatest).Admit(context.Background(), &gatepb.AdmitRequest{Id: "x"})
	if err != nil || resp.GetVerdict() != gatepb.Verdict_VERDICT_ADMIT {
		t.Errorf("Admit on a budget-only gate = %v, %v", resp, err)
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		impl     sdk.Gate
		version  int
		want     string
		admitter bool
		sdk      bool
	}{
		{&probe{}, 2, "when probed", true, true},
		{gateFunc(nil), 2, "", false, true},
		{&probe{}, 1, "when probed", false, false}, // v1 has no capabilities
	}
	for _, tt := range tests {
		resp, err := dial(t, tt.impl, tt.version).Describe(context.Background(), &gatepb.DescribeRequest{})
		if err != nil || resp.GetDescription() != tt.want || resp.GetAdmitter() != tt.admitter ||
			strings.HasPrefix(resp.GetSdk(), "sluice-sdk-go") != tt.sdk {
			t.Errorf("%T v%d: Describe = %v, %v; want %q, admitter %v", tt.impl, tt.version, resp, err, tt.want, tt.admitter)
		}
	}
}
