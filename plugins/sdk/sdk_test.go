package sdk_test

import (
	"context"
	"errors"
	"math"
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
	"github.com/sluice-io/sluice/plugins/gatepb"
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

func (p *probe) Describe() string { return "when probed" }

func (p *probe) set(level float64, err error) {
	p.mu.Lock()
	p.level, p.budget = level, err
	p.mu.Unlock()
}

// conn serves impl over go-plugin's in-memory gRPC connection, as the host
// sees it: what Dispense returns.
type conn struct {
	remote sdk.Remote
	raw    gatepb.GateClient // the wire under remote, for what it hides
	server *plugin.GRPCServer
}

func dial(t *testing.T, impl gate.Gate) conn {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, sdk.PluginSet(impl))
	t.Cleanup(func() { _ = client.Close() }) // also shuts the server down
	raw, err := client.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	remote, ok := raw.(sdk.Remote)
	if !ok {
		t.Fatalf("Dispense returned %T, not an sdk.Remote", raw)
	}
	return conn{remote: remote, raw: gatepb.NewGateClient(client.Conn), server: server}
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
			admitter, err := c.remote.Configure(context.Background(), tt.params)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Configure: %v", err)
				}
				if _, want := tt.impl.(gate.Admitter); admitter != want {
					t.Errorf("admitter = %v, want %v", admitter, want)
				}
				// Configure is once per process.
				if _, err := c.remote.Configure(context.Background(), tt.params); !errors.Is(err, sdk.ErrRefused) {
					t.Errorf("second Configure = %v, want a refusal", err)
				}
				return
			}
			if !errors.Is(err, sdk.ErrRefused) || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, sdk.ErrUnavailable) {
				t.Errorf("Configure error %v, want a refusal containing %q", err, tt.wantErr)
			}
			// On the wire the refusal is an answer, not a gRPC error.
			resp, err := c.raw.Configure(context.Background(), &gatepb.ConfigureRequest{Params: tt.params})
			if err != nil || !strings.Contains(resp.GetError(), tt.wantErr) {
				t.Errorf("raw Configure = %v, %v", resp, err)
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
	if _, err := c.remote.Configure(context.Background(), map[string]string{"level": "0.25"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	b, err := c.remote.Budget(ctx)
	if err != nil || b != 0.25 {
		t.Fatalf("Budget = %v, %v", b, err)
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
		name     string
		level    float64
		err      error
		code     codes.Code // of the error, when not a fallback
		fallback string     // the fallback's failure, when one
		wantErr  string
	}{
		{"backend down", 0.25, errors.New("backend down"), codes.Unknown, "", "budget: rpc error: code = Unknown desc = backend down"},
		{"deadline", 0.25, context.DeadlineExceeded, codes.DeadlineExceeded, "", "DeadlineExceeded"},
		{"fallback", 0.25, &gate.FallbackError{Budget: 0.5, Err: errors.New("stale")}, codes.OK, "stale", ""},
		{"fallback without cause", 0.25, &gate.FallbackError{Budget: 0.5}, codes.OK, "fallback", ""},
		{"above 1", 1.5, nil, codes.Unknown, "", "budget 1.5 outside [0,1]"},
		{"NaN", math.NaN(), nil, codes.Unknown, "", "budget NaN outside [0,1]"},
		{"negative fallback", 0, &gate.FallbackError{Budget: -1, Err: errors.New("x")}, codes.Unknown, "", "budget -1 outside [0,1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.set(tt.level, tt.err)
			b, err := c.remote.Budget(context.Background())
			var fb *gate.FallbackError
			if tt.fallback != "" {
				if !errors.As(err, &fb) || fb.Budget != 0.5 || fb.Err.Error() != tt.fallback || b != 0 {
					t.Errorf("Budget = %v, %v; want a fallback to 0.5 because %q", b, err, tt.fallback)
				}
				return
			}
			if err == nil || errors.As(err, &fb) || status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Budget = %v, %v; want code %v, an error containing %q", b, err, tt.code, tt.wantErr)
			}
			if errors.Is(err, sdk.ErrUnavailable) {
				t.Errorf("%v marked unavailable: a failing gate is not a broken plugin", err)
			}
		})
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
	d, err := c.remote.Admit(context.Background(), in)
	if err != nil || d.Verdict != gate.Defer || d.Delay != 1500*time.Millisecond || d.Reason != "later" || d.Release != nil {
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
	_, err = c.remote.Admit(ctx, &wire.Request{ID: "h", Metadata: map[string]string{"hang": "1"}})
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > time.Second {
		t.Errorf("hanging Admit = %v after %v", err, time.Since(start))
	}

	// A gate without Admit admits everything.
	d, err = dial(t, gateFunc(nil)).remote.Admit(context.Background(), &wire.Request{ID: "x"})
	if err != nil || d.Verdict != gate.Admit || d.Release != nil {
		t.Errorf("Admit on a budget-only gate = %+v, %v", d, err)
	}
}

func TestDescribe(t *testing.T) {
	for _, tt := range []struct {
		impl gate.Gate
		want string
	}{{&probe{}, "when probed"}, {gateFunc(nil), ""}} {
		if d, err := dial(t, tt.impl).remote.Describe(context.Background()); err != nil || d != tt.want {
			t.Errorf("%T: Describe = %q, %v; want %q", tt.impl, d, err, tt.want)
		}
	}
}

// A plugin that cannot be reached is told apart from one that fails: its
// errors match ErrUnavailable, for every call.
func TestUnavailable(t *testing.T) {
	c := dial(t, &probe{})
	c.server.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, cerr := c.remote.Configure(ctx, nil)
	_, berr := c.remote.Budget(ctx)
	_, aerr := c.remote.Admit(ctx, &wire.Request{ID: "x"})
	_, derr := c.remote.Describe(ctx)
	for call, err := range map[string]error{"configure": cerr, "budget": berr, "admit": aerr, "describe": derr} {
		if !errors.Is(err, sdk.ErrUnavailable) || status.Code(err) != codes.Unavailable || !strings.HasPrefix(err.Error(), call+": ") {
			t.Errorf("%s on a stopped plugin = %v, want an unavailable error naming the call", call, err)
		}
	}
}
