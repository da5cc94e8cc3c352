package gate_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/gate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scripted answers Budget from a script of results, then repeats the last.
type scripted struct {
	i       atomic.Int64
	answers []answer
}

type answer struct {
	b   float64
	err error
}

func (s *scripted) Budget(context.Context) (float64, error) {
	i := min(int(s.i.Add(1))-1, len(s.answers)-1)
	return s.answers[i].b, s.answers[i].err
}

func TestRefresherPolicies(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		policy  gate.FailurePolicy
		answers []answer
		want    []float64 // budget after each refresh
	}{
		{"closed", gate.FailClosed, []answer{{0.5, nil}, {0, boom}, {0.7, nil}}, []float64{0.5, 0, 0.7}},
		{"open", gate.FailOpen, []answer{{0.5, nil}, {0, boom}}, []float64{0.5, 1}},
		{"keep-last", gate.FailKeepLast, []answer{{0.5, nil}, {0, boom}, {0, boom}}, []float64{0.5, 0.5, 0.5}},
		{"keep-last without a good answer", gate.FailKeepLast, []answer{{0, boom}}, []float64{0}},
		{"out of range is a failure", gate.FailOpen, []answer{{1.5, nil}}, []float64{1}},
		{"fallback error bypasses the policy", gate.FailClosed,
			[]answer{{0.5, nil}, {0, &gate.FallbackError{Budget: 0.3, Err: boom}}}, []float64{0.5, 0.3}},
		{"keep-last skips fallback budgets", gate.FailKeepLast,
			[]answer{{0.5, nil}, {0, &gate.FallbackError{Budget: 0.3, Err: boom}}, {0, boom}}, []float64{0.5, 0.3, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &scripted{answers: tt.answers}
			observed := make(chan float64, 100)
			r := gate.NewRefresher(g, gate.RefresherConfig{Name: "t", Policy: tt.policy, Interval: 5 * time.Millisecond,
				Observe: func(b float64, _ error) {
					select {
					case observed <- b:
					default:
					}
				}})
			c := credit.NewPool(10, credit.Ramp{})
			r.Attach(c)
			r.Start(context.Background()) // the first refresh runs in Start
			var budgets []float64
			for len(budgets) < len(tt.want) {
				select {
				case b := <-observed:
					budgets = append(budgets, b)
				case <-time.After(5 * time.Second):
					t.Fatalf("only %d refreshes", len(budgets))
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			for i := range tt.want {
				if budgets[i] != tt.want[i] {
					t.Fatalf("budgets %v, want %v", budgets, tt.want)
				}
			}
		})
	}
}

func TestGenericParams(t *testing.T) {
	r := gate.NewRegistry()
	if err := r.Register("fixed", func(p gate.Params, _ gate.Env) (gate.Gate, error) {
		return &scripted{answers: []answer{{1, nil}}}, p.Unused()
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		vals     map[string]string
		policy   gate.FailurePolicy
		interval time.Duration
		wantErr  string
	}{
		{nil, gate.FailClosed, 0, ""},
		{map[string]string{"failure_policy": "open", "refresh_interval": "0.5"}, gate.FailOpen, 500 * time.Millisecond, ""},
		{map[string]string{"failure_policy": "keep-last"}, gate.FailKeepLast, 0, ""},
		{map[string]string{"failure_policy": "shut"}, "", 0, "unknown failure policy"},
		{map[string]string{"refresh_interval": "0"}, "", 0, "below 1ms"},
		{map[string]string{"other": "1"}, "", 0, "unknown gate_params: other"},
	}
	for _, tt := range tests {
		g, err := r.New("fixed", gate.NewParams(tt.vals), gate.Env{})
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v: error %v, want %q", tt.vals, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.vals, err)
			continue
		}
		if p := gate.PolicyOf(g); p != tt.policy {
			t.Errorf("%v: policy %q, want %q", tt.vals, p, tt.policy)
		}
		if iv := gate.IntervalOf(g); iv != tt.interval {
			t.Errorf("%v: interval %v, want %v", tt.vals, iv, tt.interval)
		}
	}
}
