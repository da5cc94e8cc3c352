package gate

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// failingGate fails every budget query.
type failingGate struct{ policy FailurePolicy }

func (failingGate) Budget(context.Context) (float64, error) { return 0, errors.New("backend down") }
func (g failingGate) FailurePolicy() FailurePolicy          { return g.policy }

type fixedGate float64

func (g fixedGate) Budget(context.Context) (float64, error) { return float64(g), nil }

// The budget adapter defers at budget 0 and counts a failed query as the
// gate's failure policy says.
func TestBudgetAdmitter(t *testing.T) {
	req := &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute)}
	for _, tt := range []struct {
		name string
		g    Gate
		want Verdict
	}{
		{"open", fixedGate(0.5), Admit},
		{"closed", fixedGate(0), Defer},
		{"failing, fail open", failingGate{FailOpen}, Admit},
		{"failing, fail closed", failingGate{FailClosed}, Defer},
		{"failing, keep last with none", failingGate{FailKeepLast}, Defer},
	} {
		d, err := AdmitterOf(tt.g).Admit(context.Background(), req)
		if err != nil || d.Verdict != tt.want {
			t.Errorf("%s: %+v, %v; want %v", tt.name, d, err, tt.want)
		}
	}
	// The policy of a configured wrapper (failure_policy) is seen through.
	wrapped := wrapConfigured(failingGate{FailClosed}, FailOpen, 0)
	if d, err := AdmitterOf(wrapped).Admit(context.Background(), req); err != nil || d.Verdict != Admit {
		t.Errorf("failure_policy open over a closed gate: %+v, %v", d, err)
	}
}

// Chain gives back what earlier members reserved when a later one does not
// admit, and joins the reservations of an admission into one release that
// runs each once, in reverse order.
func TestChain(t *testing.T) {
	var order []string
	reserve := func(name string) Admitter {
		return admitFunc(func() (Decision, error) {
			return Decision{Verdict: Admit, Release: func() { order = append(order, name) }}, nil
		})
	}
	deny := admitFunc(func() (Decision, error) { return Decision{Verdict: Defer, Reason: "full"}, nil })
	req := &wire.Request{ID: "r"}
	d, err := Chain(context.Background(), req, reserve("a"), reserve("b"), deny)
	if err != nil || d.Verdict != Defer || d.Release != nil || len(order) != 2 || order[0] != "b" || order[1] != "a" {
		t.Fatalf("refused chain: %+v, %v, released %v", d, err, order)
	}
	order = nil
	d, err = Chain(context.Background(), req, reserve("a"), reserve("b"))
	if err != nil || d.Verdict != Admit || d.Release == nil || len(order) != 0 {
		t.Fatalf("admitted chain: %+v, %v, released %v", d, err, order)
	}
	d.Release()
	d.Release()
	if len(order) != 2 || order[0] != "b" || order[1] != "a" {
		t.Errorf("released %v, want [b a] once", order)
	}
}

type admitFunc func() (Decision, error)

func (f admitFunc) Admit(context.Context, *wire.Request) (Decision, error) { return f() }

// Chain joins its members' observers in order, and drops them when a
// member refuses (a refused request is never dispatched).
func TestChainObservers(t *testing.T) {
	req := &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute)}
	var seen []string
	obs := func(name string) func(Feedback) {
		return func(fb Feedback) { seen = append(seen, name+":"+http.StatusText(fb.StatusCode)) }
	}
	a := admitFunc(func() (Decision, error) { return Decision{Verdict: Admit, Observe: obs("a")}, nil })
	plain := admitFunc(func() (Decision, error) { return Admitted, nil })
	b := admitFunc(func() (Decision, error) { return Decision{Verdict: Admit, Observe: obs("b")}, nil })
	refuse := admitFunc(func() (Decision, error) { return Decision{Verdict: Defer}, nil })

	d, err := Chain(context.Background(), req, a, plain, b)
	if err != nil || d.Verdict != Admit || d.Observe == nil {
		t.Fatalf("Chain = %+v, %v; want Admit with an Observe", d, err)
	}
	d.Observe(Feedback{StatusCode: http.StatusTooManyRequests})
	if got := strings.Join(seen, ","); got != "a:Too Many Requests,b:Too Many Requests" {
		t.Errorf("observers saw %q", got)
	}
	if d, _ := Chain(context.Background(), req, a, refuse); d.Observe != nil {
		t.Errorf("a refused chain carries an Observe")
	}
	if d, _ := Chain(context.Background(), req, plain, plain); d.Observe != nil {
		t.Errorf("a chain of members that do not observe carries an Observe")
	}
	if JoinObservers(nil, nil) != nil {
		t.Errorf("JoinObservers of nils is not nil")
	}
}

// The first member that places the request on a pod decides its pod; a
// member that places nothing leaves it to the others.
func TestChainPod(t *testing.T) {
	place := func(pod string) Admitter {
		return admitFunc(func() (Decision, error) { return Decision{Verdict: Admit, Pod: pod}, nil })
	}
	req := &wire.Request{ID: "r"}
	for _, tc := range []struct {
		members []Admitter
		want    string
	}{
		{[]Admitter{place(""), place("http://pod-1")}, "http://pod-1"},
		{[]Admitter{place("http://pod-0"), place("http://pod-1")}, "http://pod-0"},
		{[]Admitter{place(""), place("")}, ""},
	} {
		d, err := Chain(context.Background(), req, tc.members...)
		if err != nil || d.Verdict != Admit || d.Pod != tc.want {
			t.Errorf("chain: %+v, %v; want admitted on %q", d, err, tc.want)
		}
	}
}

// limitingGate is a gate with per-pod limits.
type limitingGate struct{ fixedGate }

func (limitingGate) PodReadings() []PodReading { return []PodReading{{Pod: "http://pod-0", Limit: 3}} }

// Find looks through wrappers for the optional interface asked for.
func TestFindThroughWrappers(t *testing.T) {
	wrapped := wrapConfigured(limitingGate{fixedGate(1)}, FailOpen, 0)
	if _, direct := wrapped.(PodReporter); direct {
		t.Fatal("the wrapper itself is a PodReporter: the case tests nothing")
	}
	r := PodReporterOf(wrapped)
	if r == nil || r.PodReadings()[0].Limit != 3 {
		t.Fatalf("PodReporterOf through a wrapper: %v", r)
	}
	if PodReporterOf(wrapConfigured(fixedGate(1), FailOpen, 0)) != nil || PodReporterOf(nil) != nil {
		t.Error("PodReporterOf found a reporter on a gate that has none")
	}
}
