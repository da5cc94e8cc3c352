package headroom_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/testenv"
)

// replica builds one replica's gate on p, sharing the account in r, its
// lines logged to log (nil: discarded).
func replica(t *testing.T, p *pods, r *testenv.Redis, id, extra string, log *testenv.Buffer) *headroom.Gate {
	t.Helper()
	reg := gate.NewRegistry()
	if err := reg.Register(headroom.Type, headroom.Factory); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	params := p.params(fmt.Sprintf(`,"reserve":2,"hold":"-1ns","account_redis":%q,"replica":%q%s`, r.Addr, id, extra))
	g, err := gatetest.Build(t, reg, headroom.Type, params, gate.Env{MaxConcurrency: 64, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return g.(*headroom.Gate)
}

// admitN admits n requests on g (placed, with dispatch "pods").
func admitN(t *testing.T, g *headroom.Gate, n int) {
	t.Helper()
	for range n {
		d, err := g.Admit(context.Background(), &wire.Request{})
		if err != nil || d.Verdict != gate.Admit {
			t.Fatalf("Admit = %+v, %v", d, err)
		}
	}
}

// read takes one reading of each gate in turn and fails on an error.
func read(t *testing.T, gs ...*headroom.Gate) {
	t.Helper()
	for _, g := range gs {
		if _, err := g.Budget(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Two replicas on one pool count each other's calls as the batch's, not
// as other traffic; the room the rule leaves is split between them, and
// so is an excess: they take back what it is between them, not each.
func TestAccountGatewayReplicas(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 2)
	a := replica(t, p, r, "a", "", nil)
	b := replica(t, p, r, "b", "", nil)
	admitN(t, a, 12)
	admitN(t, b, 4)
	p.set(0, 9, 0) // the 16 calls and 2 interactive requests
	p.set(1, 9, 0)
	// each replica's limit rises to its part a reading after the other
	// replicas read its room (TestAccountGatewayPeersFreshAdmissions)
	read(t, a, b, a, b)
	ra, rb := a.Last(), b.Last()
	if ra.Own != 12 || ra.Peers != 4 || ra.Others != 2 || ra.Replicas != 2 || rb.Own != 4 || rb.Peers != 12 || rb.Others != 2 {
		t.Fatalf("a read %+v, b read %+v; want own 12 and 4, peers 4 and 12, others 2 each", ra, rb)
	}
	// 32 seats − 2 reserve − 2 others = 28 for the batch of both: 16 held,
	// room 12, 6 each (a replica alone would see others 6 and 14)
	if ra.Allowed != 18 || rb.Allowed != 10 {
		t.Errorf("limits %d and %d, want 18 and 10 (the room split, 28 in all)", ra.Allowed, rb.Allowed)
	}
	// 22 others: 8 seats left for 16 calls; the excess of 8 is split by
	// what each holds (6 and 2), not taken back by each; the rise counts
	// from a replica's second reading of it (the other's published room,
	// 6, could explain as much of it)
	p.set(0, 19, 0)
	p.set(1, 19, 0)
	read(t, a, b, a, b)
	ra, rb = a.Last(), b.Last()
	if ra.Allowed+rb.Allowed != 8 || ra.Allowed != 6 || rb.Allowed != 2 {
		t.Errorf("limits %d and %d after an excess of 8, want 6 and 2 (8 in all)", ra.Allowed, rb.Allowed)
	}
	if ba, _ := a.Budget(context.Background()); ba != 6.0/64 {
		t.Errorf("a's budget %v, want 6/64", ba)
	}
	if !strings.Contains(a.Describe(), "as replica a") {
		t.Errorf("Describe() = %q, want the account named", a.Describe())
	}
}

// With dispatch "pods" the replicas share per pod: each pod's other
// traffic leaves out every replica's calls there, and a pod's excess is
// split between the replicas holding calls there.
func TestAccountPodsReplicas(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 2)
	extra := `,"dispatch":"pods","pending_prefills":100`
	a := replica(t, p, r, "a", extra, nil)
	b := replica(t, p, r, "b", extra, nil)
	read(t, a, b, a)
	if lim := podLimits(a); lim[base(p, 0)] != 7 || lim[base(p, 1)] != 7 {
		t.Fatalf("a's PodLimits %v before any call, want 7 per pod (14 split in two)", lim)
	}
	admitN(t, a, 8) // 4 per pod
	admitN(t, b, 4) // 2 per pod
	p.set(0, 6+1, 0)
	p.set(1, 6, 0)
	// a rise of others counts from a replica's second reading of it (see
	// TestAccountPeersFreshPlacement)
	read(t, a, b, a, b)
	pa, pb := a.Last().Pods, b.Last().Pods
	if pa[0].Own != 4 || pa[0].Peers != 2 || pa[0].Others != 1 || pa[1].Others != 0 || pb[0].Peers != 4 || pb[0].Others != 1 {
		t.Fatalf("a's pods %+v, b's %+v; want own 4, peers 2, others 1 on pod 0 and no others on pod 1", pa, pb)
	}
	// 11 others on pod 0: 3 seats for the 6 calls there, 3 taken back
	// between the replicas (2 and 1, as they hold 4 and 2); pod 1 keeps
	// its room (8), split
	p.set(0, 6+11, 0)
	read(t, a, b, a, b)
	la, lb := podLimits(a), podLimits(b)
	if la[base(p, 0)] != 2 || lb[base(p, 0)] != 1 || la[base(p, 1)] != 8 || lb[base(p, 1)] != 6 {
		t.Errorf("PodLimits a %v b %v; want 2 and 1 on pod 0 (3 in all), 8 and 6 on pod 1 (14 in all)", la, lb)
	}
	// a replica with dispatch "gateway" on the same account counts the
	// others' calls pool-wide; they cannot place its calls on a pod
	c := replica(t, p, r, "c", "", nil)
	admitN(t, c, 1)
	read(t, c, a)
	if got := c.Last(); got.Peers != 12 || got.Replicas != 3 {
		t.Errorf("the gateway replica sees peers %d of %d replicas, want 12 of 3", got.Peers, got.Replicas)
	}
	if got := a.Last(); got.Peers != 4 || got.Replicas != 2 {
		t.Errorf("a pods replica sees peers %d of %d replicas beside a gateway one, want 4 of 2", got.Peers, got.Replicas)
	}
}

// A replica whose part of the pods is taken hands a request back to the
// queue while another replica has room (it would wait here for its own
// part), and keeps it waiting when no replica has room.
func TestAccountHandBack(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 1)
	extra := `,"dispatch":"pods","pending_prefills":100`
	a := replica(t, p, r, "a", extra, nil)
	b := replica(t, p, r, "b", extra, nil)
	read(t, a, b, a)
	admitN(t, a, 7) // a's part of 14
	d, err := a.Admit(context.Background(), &wire.Request{})
	if err != nil || d.Verdict != gate.Defer || !strings.Contains(d.Reason, "another replica has room") {
		t.Fatalf("Admit with b's part free = %+v, %v; want a Defer back to the queue", d, err)
	}
	admitN(t, b, 7)
	p.set(0, 14, 0)
	read(t, a, b, a)
	if d, err := a.Admit(context.Background(), &wire.Request{}); err != nil || d.Verdict != gate.Wait {
		t.Errorf("Admit with the pod full = %+v, %v; want a Wait", d, err)
	}
}

// A replica that stops publishing drops out within the TTL; one that
// closes its gate drops out at once.
func TestAccountReplicaExpires(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 1)
	ttl := `,"account_ttl":"300ms"`
	a := replica(t, p, r, "a", ttl, nil)
	b := replica(t, p, r, "b", ttl, nil)
	c := replica(t, p, r, "c", ttl, nil)
	admitN(t, b, 4)
	admitN(t, c, 3)
	read(t, b, c, a)
	if got := a.Last(); got.Peers != 7 || got.Replicas != 3 {
		t.Fatalf("a sees peers %d of %d replicas, want 7 of 3", got.Peers, got.Replicas)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	read(t, b, a)
	if got := a.Last(); got.Peers != 4 || got.Replicas != 2 {
		t.Fatalf("after c closed, a sees peers %d of %d replicas, want 4 of 2", got.Peers, got.Replicas)
	}
	time.Sleep(400 * time.Millisecond) // b stops reading: dead
	read(t, a)
	if got := a.Last(); got.Peers != 0 || got.Replicas != 1 || got.Others != 0 {
		t.Errorf("after b's TTL, a sees %+v; want no peers, 1 replica", got)
	}
}

// Redis down: the gate keeps reading the pods, keeps the last peers for
// the TTL, then counts none, and says so once.
func TestAccountDown(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 1)
	var log testenv.Buffer
	a := replica(t, p, r, "a", `,"account_ttl":"1s"`, &log)
	b := replica(t, p, r, "b", `,"account_ttl":"1s"`, nil)
	clock := time.Now()
	a.SetClock(func() time.Time { return clock })
	admitN(t, b, 5)
	p.set(0, 5, 0)
	read(t, b, a)
	if got := a.Last(); got.Peers != 5 || got.Others != 0 {
		t.Fatalf("a sees %+v, want peers 5, others 0", got)
	}
	r.Stop()
	for range 3 {
		clock = clock.Add(300 * time.Millisecond)
		read(t, a)
		if got := a.Last(); got.Peers != 5 || got.Others != 0 {
			t.Fatalf("within the TTL of an outage a sees %+v, want the last peers (5)", got)
		}
	}
	clock = clock.Add(200 * time.Millisecond)
	read(t, a, a)
	if got := a.Last(); got.Peers != 0 || got.Others != 5 || got.Replicas != 1 {
		t.Errorf("past the TTL of an outage a sees %+v, want no peers (others 5)", got)
	}
	if n := strings.Count(log.String(), "replica account failed"); n != 1 {
		t.Errorf("%d log lines on the outage, want 1:\n%s", n, log.String())
	}
}

// Bad account parameters are refused, naming what to set.
func TestAccountConfigErrors(t *testing.T) {
	p := newPods(t, 1)
	for _, c := range []struct{ params, want string }{
		{p.params(`,"replica":"a"`), "need gate_params.account_redis"},
		{p.params(`,"account_redis":"nohost"`), "gate_params.account_redis"},
		{p.params(`,"account_redis":"deployment"`), "names no Redis"},
		{p.params(`,"account_redis":"127.0.0.1:1","replica":"a b"`), `gate_params.replica: "a b"`},
		{p.params(`,"account_redis":"127.0.0.1:1","account_ttl":"60ms"`), "at least two refresh intervals"},
		{p.params(`,"account_redis":"127.0.0.1:1","account_ttl":"0s"`), "account_ttl"},
	} {
		if _, err := build(t, c.params, 8); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.params, err, c.want)
		}
	}
}

// fill places n calls of g on the one pod of p, one per reading (as
// pending_prefills 1 lets it), the pod running them beside run others;
// each reading publishes g's calls before the next replica reads.
func fill(t *testing.T, p *pods, g *headroom.Gate, n int, running *int, rest ...*headroom.Gate) {
	t.Helper()
	for range n {
		read(t, g)
		admitN(t, g, 1)
		*running++
		p.set(0, *running, 0)
		read(t, append([]*headroom.Gate{g}, rest...)...)
	}
}

// A call another replica placed since its last exchange is on the pod
// but not yet in the account: read as other traffic, held for the hold,
// it would still be held once the account counts it, and lower the
// pool's limit by one for the hold (on a full pool, below what the
// replicas hold together: a take-back of a call that is in nobody's way).
// A rise the peers' placements could explain waits for the next reading;
// a rise that stays, or a larger one, counts.
func TestAccountPeersFreshPlacement(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 1)
	a, b, clock := clockedPair(t, p, r, `,"dispatch":"pods","hold":"1s"`)
	running := 0
	fill(t, p, a, 7, &running, b)
	fill(t, p, b, 5, &running, a)
	*clock = clock.Add(2 * time.Second) // past any hold
	read(t, a, b, a)
	if got := a.Last().Pods[0]; got.Own != 7 || got.Peers != 5 || got.Others != 0 || got.Pooled != 14 {
		t.Fatalf("a's pod %+v, want own 7, peers 5, no others, 14 for the batch", got)
	}
	// b places its 6th call on the pod after its reading (its part of
	// the room of 2); a reads the pod before b publishes it
	read(t, b)
	admitN(t, b, 1)
	running++
	p.set(0, running, 0)
	*clock = clock.Add(50 * time.Millisecond)
	read(t, a)
	if got := a.Last().Pods[0]; got.Others != 0 || got.Held != 0 || got.Pooled != 14 {
		t.Errorf("a's pod with b's call not yet published: %+v, want no others and 14 for the batch (b's call is the batch's)", got)
	}
	*clock = clock.Add(50 * time.Millisecond)
	read(t, b, a)
	if got := a.Last().Pods[0]; got.Peers != 6 || got.Held != 0 || got.Pooled != 14 {
		t.Errorf("a's pod once b published its call: %+v, want peers 6, nothing held, 14 for the batch", got)
	}
	// an interactive request that stays: counted one reading later
	running++
	p.set(0, running, 0)
	*clock = clock.Add(50 * time.Millisecond)
	read(t, b, a)
	first := a.Last().Pods[0].Others
	*clock = clock.Add(50 * time.Millisecond)
	read(t, b, a)
	if got := a.Last().Pods[0]; first != 0 || got.Others != 1 || got.Held != 1 {
		t.Errorf("an interactive request on the pod: others %d then %+v; want 0 then 1 (held 1)", first, got)
	}
	// a rise beyond what the peers could have placed counts at once, less
	// that much
	running += 4
	p.set(0, running, 0)
	*clock = clock.Add(50 * time.Millisecond)
	read(t, b, a)
	if got := a.Last().Pods[0]; got.Others != 4 {
		t.Errorf("4 more interactive requests: others %d, want 4 at once (5 less the 1 b could have placed)", got.Others)
	}
	// alone, a replica counts a rise at once (b's calls ended with it)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	running += 1 - 6
	p.set(0, running, 0)
	*clock = clock.Add(50 * time.Millisecond)
	read(t, a)
	if got := a.Last(); got.Replicas != 1 || got.Pods[0].Others != 6 {
		t.Errorf("a alone, one more interactive request: %+v; want 1 replica, others 6 at once", got)
	}
}

// gatewayPair returns two gateway replicas, a and b, on one pod with a
// hold of 1s and a shared fake clock (advanced by tick), settled: a holds
// 6 calls and b 4, no other traffic, so the batch of both may have 14
// seats (16 less the reserve of 2) and the room of 4 is split: a's limit
// is 8, b's 6, and each published a room of 2 (its limit less its calls).
func gatewayPair(t *testing.T) (p *pods, a, b *headroom.Gate, tick func()) {
	t.Helper()
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p = newPods(t, 1)
	var clock *time.Time
	a, b, clock = clockedPair(t, p, r, `,"hold":"1s"`)
	tick = func() { *clock = clock.Add(50 * time.Millisecond) }
	admitN(t, a, 6)
	admitN(t, b, 4)
	p.set(0, 10, 0)
	read(t, a, b, a, b)
	*clock = clock.Add(2 * time.Second) // past the peaks a read alone
	for range 2 {
		tick()
		read(t, a, b)
	}
	if ra, rb := a.Last(), b.Last(); ra.Others != 0 || ra.Held != 0 || ra.Allowed != 8 || rb.Allowed != 6 {
		t.Fatalf("settled: a read %+v, b read %+v; want no others, limits 8 and 6", ra, rb)
	}
	return p, a, b, tick
}

// A gateway replica admits up to its room just after its reading: the
// calls are on the pool before the account counts them. The other
// replica does not read them as other traffic (its limit does not fall
// for a reading, and the hold keeps nothing), since they are within the
// room the replica published; once published they are the batch's.
func TestAccountGatewayPeersFreshAdmissions(t *testing.T) {
	p, a, b, tick := gatewayPair(t)
	read(t, b)
	admitN(t, b, 2) // its room
	p.set(0, 12, 0)
	tick()
	read(t, a)
	if got := a.Last(); got.Peers != 4 || got.Others != 0 || got.Held != 0 || got.Allowed != 8 {
		t.Errorf("a with b's 2 new calls not yet published: %+v; want peers 4, no others, nothing held, limit 8 (as before)", got)
	}
	tick()
	read(t, b, a)
	// the room left, 2, is split: a's limit 7
	if got := a.Last(); got.Peers != 6 || got.Others != 0 || got.Held != 0 || got.Allowed != 7 {
		t.Errorf("a once b published its calls: %+v; want peers 6, no others, nothing held, limit 7", got)
	}
}

// A rise of the other traffic within the peers' published room counts
// from the next reading on (a rise that stays is interactive traffic);
// the part of a rise beyond that room counts at once.
func TestAccountGatewayInteractiveRise(t *testing.T) {
	p, a, b, tick := gatewayPair(t)
	p.set(0, 12, 0) // 2 interactive requests
	tick()
	read(t, b, a)
	if got := a.Last(); got.Others != 0 {
		t.Errorf("2 interactive requests, first reading: others %d, want 0 (b's room of 2 could explain them)", got.Others)
	}
	tick()
	read(t, b, a)
	// 14 − 2 = 12 for 10 calls: room 2, a's part 1
	if got := a.Last(); got.Others != 2 || got.Held != 2 || got.Allowed != 7 {
		t.Errorf("2 interactive requests, second reading: %+v; want others 2, held 2, limit 7", got)
	}
	// b's limit is 5 now, its room 1: of 5 more requests, 4 count at once
	p.set(0, 17, 0)
	tick()
	read(t, b, a)
	if got := a.Last(); got.Others != 6 {
		t.Errorf("5 more interactive requests: others %d, want 6 at once (7 less b's room of 1)", got.Others)
	}
	tick()
	read(t, b, a)
	if got := a.Last(); got.Others != 7 {
		t.Errorf("5 more interactive requests, next reading: others %d, want 7", got.Others)
	}
}

// A field in the format before rooms (an older sluice's, "<expiry>:<calls>")
// is counted by its calls, as a replica that published no room: pool-wide
// a rise of others counts at once, as it did before rooms.
func TestAccountOldFormatField(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 1)
	a := replica(t, p, r, "a", `,"account_key":"k"`, nil)
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	old := func() {
		t.Helper()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, "k", "old", fmt.Sprintf("%d:5", now.Add(10*time.Second).UnixMilli())).Err(); err != nil {
			t.Fatal(err)
		}
	}
	admitN(t, a, 3)
	p.set(0, 8, 0)
	old()
	read(t, a)
	if got := a.Last(); got.Peers != 5 || got.Replicas != 2 || got.Others != 0 {
		t.Fatalf("a beside an older replica holding 5: %+v; want peers 5, 2 replicas, no others", got)
	}
	p.set(0, 10, 0)
	read(t, a)
	if got := a.Last(); got.Others != 2 {
		t.Errorf("2 interactive requests beside an older replica: others %d, want 2 at once (it published no room)", got.Others)
	}
	v, err := c.HGet(ctx, "k", "a").Result()
	// its first limit: 3 + its half of the room of 14 − 8
	if err != nil || !strings.HasSuffix(v, ":3,room=3") {
		t.Errorf("a's field %q, %v; want <expiry>:3,room=3 (3 calls, its limit of 6 less 3)", v, err)
	}
}

// A pod's limit is split between the replicas by the calls running now: a
// call one replica released within the grace has left its seat, and its
// replacement is no excess for the other replica to take back a call
// for. Both ways round, as which replica takes back an excess of one
// depends on the replicas' order.
func TestAccountPodsSplitByRunning(t *testing.T) {
	for _, first := range []bool{true, false} {
		r := testenv.StartRedis(t, testenv.RedisOptions{})
		p := newPods(t, 1)
		extra := `,"dispatch":"pods","pending_prefills":100`
		a := replica(t, p, r, "a", extra, nil)
		b := replica(t, p, r, "b", extra, nil)
		clock := time.Now()
		for _, g := range []*headroom.Gate{a, b} {
			g.SetClock(func() time.Time { return clock }) // held: the grace never ends
		}
		x, y := a, b // x's call finishes
		if !first {
			x, y = b, a
		}
		read(t, x, y, x, y)
		var done func()
		for k := range 7 {
			d, err := x.Admit(context.Background(), &wire.Request{})
			if err != nil || d.Verdict != gate.Admit {
				t.Fatalf("Admit = %+v, %v", d, err)
			}
			if k == 0 {
				done = d.Release
			}
		}
		admitN(t, y, 7)
		p.set(0, 14, 0)
		read(t, x, y, x, y)
		if lx, ly := x.Last().Pods[0].Allowed, y.Last().Pods[0].Allowed; lx != 7 || ly != 7 {
			t.Fatalf("a full pod (14 for the batch, 7 calls each): limits %d and %d, want 7 and 7", lx, ly)
		}
		// one of x's calls finishes and leaves the pod; x fills its seat
		// again when its part of the pod has room
		done()
		live := map[*headroom.Gate]int{x: 6, y: 7}
		p.set(0, 13, 0)
		read(t, x)
		if d, err := x.Admit(context.Background(), &wire.Request{}); err != nil {
			t.Fatal(err)
		} else if d.Verdict == gate.Admit {
			live[x]++
			p.set(0, 14, 0)
		}
		read(t, y, x, y)
		for g, n := range live {
			if pr := g.Last().Pods[0]; pr.Allowed < n {
				t.Errorf("x first %v: a replica running %d of the pod's %d calls is allowed %d: it would take back a call in nobody's way (%+v)",
					first, n, live[x]+live[y], pr.Allowed, pr)
			}
		}
		if sum := x.Last().Pods[0].Allowed + y.Last().Pods[0].Allowed; sum != 14 {
			t.Errorf("x first %v: the replicas' limits add up to %d, want the pod's 14", first, sum)
		}
	}
}

// The replicas hold the highest peak of others any of them read: a burst
// one replica read between two readings of the other lowers both
// replicas' limit for the pod alike, so that neither places a call the
// other takes back.
func TestAccountPodsSharedHeld(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p := newPods(t, 1)
	a, b, clock := clockedPair(t, p, r, `,"dispatch":"pods","hold":"1s"`)
	tick := func() { *clock = clock.Add(10 * time.Millisecond) }
	read(t, a, b)
	// 4 interactive requests for two of a's readings, gone before b reads
	p.set(0, 4, 0)
	tick()
	read(t, a)
	tick()
	read(t, a)
	p.set(0, 0, 0)
	tick()
	read(t, a) // publishes the peak its readings hold
	tick()
	read(t, b)
	pa, pb := a.Last().Pods[0], b.Last().Pods[0]
	if pa.Held != 4 || pb.Held != 4 || pa.Pooled != pb.Pooled || pb.Pooled != 10 {
		t.Errorf("a's pod %+v, b's %+v; want both holding 4 (a's peak), the batch's limit 10 for both", pa, pb)
	}
	// b's own readings saw nothing: its others stay 0
	if pb.Others != 0 {
		t.Errorf("b's others %d, want 0 (it read no interactive request)", pb.Others)
	}
	// without a hold no peak is remembered, a peer's neither
	c := replica(t, p, r, "c", `,"dispatch":"pods","hold":"-1ns"`, nil)
	c.SetClock(func() time.Time { return *clock })
	read(t, c)
	if pc := c.Last().Pods[0]; pc.Held != 0 || pc.Pooled != 14 {
		t.Errorf("c without a hold beside a's peak of 4: %+v, want nothing held, 14 for the batch", pc)
	}
}

// clockedPair is two replicas "a" and "b" on p and r with extra params,
// reading the one clock the test moves.
func clockedPair(t *testing.T, p *pods, r *testenv.Redis, extra string) (a, b *headroom.Gate, clock *time.Time) {
	t.Helper()
	a, b = replica(t, p, r, "a", extra, nil), replica(t, p, r, "b", extra, nil)
	now := time.Now()
	clock = &now
	for _, g := range []*headroom.Gate{a, b} {
		g.SetClock(func() time.Time { return *clock })
	}
	return a, b, clock
}
