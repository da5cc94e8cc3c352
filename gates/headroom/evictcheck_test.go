package headroom_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/headroom"
)

// newAbortPods are fake model servers (pods) with 3 requests running each
// and their abort counters exported.
func newAbortPods(t *testing.T, n int) *pods {
	p := newPods(t, n)
	for i := range n {
		p.set(i, 3, 0)
	}
	p.exportAborts = true
	return p
}

func (p *pods) addAborts(i int, n float64) {
	p.mu.Lock()
	p.aborts[i] += n
	p.mu.Unlock()
}

func (p *pods) setAborts(i int, n float64) {
	p.mu.Lock()
	p.aborts[i] = n
	p.mu.Unlock()
}

// checkGate is a gate on p whose clock the test moves, logging into log.
type checkGate struct {
	*headroom.Gate
	t     *testing.T
	clock time.Time
	log   *bytes.Buffer
}

func newCheckGate(t *testing.T, p *pods, mode string) *checkGate {
	var buf bytes.Buffer
	g, err := headroom.New(headroom.Config{Endpoints: p.urls(), SeatsPerPod: 16, MaxConcurrency: 16, EvictCheck: mode,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	cg := &checkGate{Gate: g, t: t, clock: time.Now(), log: &buf}
	g.SetClock(func() time.Time { return cg.clock })
	return cg
}

// readings moves the clock 50 ms and reads the pods, n times.
func (g *checkGate) readings(n int) {
	g.t.Helper()
	for range n {
		g.clock = g.clock.Add(50 * time.Millisecond)
		if _, err := g.Budget(context.Background()); err != nil {
			g.t.Fatal(err)
		}
	}
}

func (g *checkGate) state() gate.EvictionState { return g.EvictionState(context.Background()) }

// The check on fake pods: in auto mode, a counter that never rose judges
// nothing (vLLM V1 declares it and counts no abort) and says so once;
// once the pods counted an abort, a check whose aborts do not show within
// evict_check_readings suspends eviction for the back-off (doubled after
// a failed retry), one that shows ends at once and resets the back-off;
// while a judging check is open, eviction waits (Pending).
func TestEvictCheck(t *testing.T) {
	p := newAbortPods(t, 2)
	g := newCheckGate(t, p, "")
	ctx := context.Background()
	g.readings(1)

	// counter at 0 since the start: not judged, logged once, never pending
	g.Evicted(ctx, 4)
	if st := g.state(); st.Pending || st.Suspended {
		t.Fatalf("auto, no abort ever counted: state %+v, want neither pending nor suspended", st)
	}
	g.readings(10)
	g.Evicted(ctx, 2)
	g.readings(10)
	if st := g.state(); st.Suspended {
		t.Fatalf("auto, no abort ever counted: suspended (%s)", st.Reason)
	}
	if n := strings.Count(g.log.String(), "cannot judge"); n != 1 {
		t.Fatalf("%d lines about an unjudged check, want 1:\n%s", n, g.log)
	}

	// an abort of the other traffic: the pods count aborts
	p.addAborts(0, 1)
	g.readings(1)
	g.Evicted(ctx, 4)
	g.readings(1)
	if st := g.state(); !st.Pending || st.Suspended {
		t.Fatalf("a check open: state %+v, want pending", st)
	}
	p.addAborts(1, 1) // 1 of 4: not enough
	g.readings(8)
	if st := g.state(); !st.Pending {
		t.Fatalf("9 readings, 1 of 4 aborts shown: state %+v, want still pending", st)
	}
	g.readings(1)
	st := g.state()
	if !st.Suspended || st.Pending || !st.Until.Equal(g.clock.Add(30*time.Second)) {
		t.Fatalf("10 readings, 1 of 4 aborts shown: state %+v, want suspended for 30s", st)
	}
	for _, want := range []string{p.urls()[0], p.urls()[1], "counted 1 of the 4 calls", `vllm:request_success_total{finished_reason="abort"}`} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("reason %q does not mention %q", st.Reason, want)
		}
	}
	g.Evicted(ctx, 3) // while suspended (a race with the evictor): ignored
	g.clock = g.clock.Add(29 * time.Second)
	if !g.state().Suspended {
		t.Fatal("suspension over before its back-off")
	}

	// after the back-off: a retry that fails again doubles it
	g.readings(20) // 1 s: past the 30 s
	if st := g.state(); st.Suspended || st.Pending {
		t.Fatalf("after the back-off: state %+v, want eviction allowed", st)
	}
	g.Evicted(ctx, 2)
	g.readings(10)
	if st := g.state(); !st.Suspended || !st.Until.Equal(g.clock.Add(time.Minute)) {
		t.Fatalf("a failed retry: state %+v, want suspended for 1m", st)
	}

	// a retry whose aborts show ends at once and resets the back-off
	g.clock = g.clock.Add(time.Minute)
	g.Evicted(ctx, 3)
	p.addAborts(0, 1)
	p.addAborts(1, 1) // 2 ≥ ceil(3/2)
	g.readings(1)
	if st := g.state(); st.Suspended || st.Pending {
		t.Fatalf("aborts shown: state %+v, want eviction allowed", st)
	}
	g.Evicted(ctx, 1)
	g.readings(10)
	if st := g.state(); !st.Suspended || !st.Until.Equal(g.clock.Add(30*time.Second)) {
		t.Fatalf("after a passed check: state %+v, want the back-off back at 30s", st)
	}

	// a pod restarted: its counter began again, and what it shows counts
	g.clock = g.clock.Add(time.Minute)
	g.readings(1)
	g.Evicted(ctx, 2)
	p.setAborts(0, 1) // was 3
	g.readings(1)
	if st := g.state(); st.Suspended || st.Pending {
		t.Fatalf("a restarted pod's abort: state %+v, want the check passed", st)
	}
}

// strict judges from the start: a counter no pod exports counts nothing,
// so a check fails (and the gate said so at its first reading); off
// never checks.
func TestEvictCheckStrictAndOff(t *testing.T) {
	p := newAbortPods(t, 1)
	p.mu.Lock()
	p.exportAborts = false
	p.mu.Unlock()
	g := newCheckGate(t, p, headroom.EvictCheckStrict)
	g.readings(1)
	if !strings.Contains(g.log.String(), "no pod exports the abort counter") {
		t.Errorf("no start-up line about the missing counter:\n%s", g.log)
	}
	g.Evicted(context.Background(), 1)
	if !g.state().Pending {
		t.Fatal("strict: a check open is not pending")
	}
	g.readings(10)
	if st := g.state(); !st.Suspended {
		t.Fatalf("strict, no counter: state %+v, want suspended", st)
	}

	off := newCheckGate(t, p, headroom.EvictCheckOff)
	off.readings(1)
	off.Evicted(context.Background(), 5)
	off.readings(20)
	if st := off.state(); st != (gate.EvictionState{}) || off.log.Len() != 0 {
		t.Fatalf("off: state %+v, log %q; want nothing", st, off.log)
	}
}

// The check's parameters reach the gate (Describe names them).
func TestEvictCheckParams(t *testing.T) {
	p := newPods(t, 1)
	g := mustBuild(t, p.params(`,"evict_check":"strict","evict_check_readings":3,"evict_check_backoff":"5s","abort_metric":"srv:aborted_total","abort_labels":{"why":"client"}`), 8)
	if d := g.Describe(); !strings.Contains(d, `eviction checked (strict) on srv:aborted_total{why="client"} within 3 readings, back-off 5s`) {
		t.Errorf("Describe() = %q", d)
	}
	if d := mustBuild(t, p.params(``), 8).Describe(); !strings.Contains(d, `eviction checked (auto) on vllm:request_success_total{finished_reason="abort"} within 10 readings, back-off 30s`) {
		t.Errorf("defaults: Describe() = %q", d)
	}
}
