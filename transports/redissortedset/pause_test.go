package redissortedset_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/redisclient"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// TestCrossSlotPausedHolder walks the two paused-holder interleavings of
// the cross-slot settle that TestModelSortedSetCrossSlot draws only now and
// then, so that every `make test` runs them: replica A is frozen inside its
// settle (as SIGSTOP would freeze it: no heartbeat, no write), its lease runs
// out, replica B's reclaimer acts, then A resumes.
//   - paused before PREPARE: B's reclaim returns the request to the queue, B
//     claims and answers it; A's resumed settle is fenced out (a late result).
//   - paused before PUSH (prepared): B's reclaim finishes A's settle from its
//     record; A's resumed PUSH finds the marker and its COMMIT the claim gone.
//
// Either way: exactly one result, nothing claimed or settling afterwards.
func TestCrossSlotPausedHolder(t *testing.T) {
	rd := startModelCluster(t)
	for _, tc := range []struct {
		name  string
		point int
	}{{"before-prepare", rss.FaultBeforePrepare}, {"before-push", rss.FaultBeforePush}} {
		t.Run(tc.name, func(t *testing.T) { pausedHolder(t, rd, tc.point) })
	}
}

func pausedHolder(t *testing.T, rd *modelRedis, point int) {
	ctx := context.Background()
	pool := "paused-" + t.Name()[len(t.Name())-4:]
	q := transport.Queue{Name: "llm-d-async:requests:" + pool, ResultName: "llm-d-async:results:" + pool + ":$batch"}
	if redisclient.Slot(q.Name) == redisclient.Slot(q.ResultName) {
		t.Fatalf("%s and %s share a slot: pick another pool name", q.Name, q.ResultName)
	}
	k := keys.Names{Cluster: true}.Queue(q.Name)
	admin := redis.NewClient(&redis.Options{Addr: rd.addr()})
	defer admin.Close()
	prod, err := producer.Dial(rd.url(), producer.Config{TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, ResultQueueName: q.ResultName})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.Enqueue(ctx, q.Name, request("p1", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	open := func() (*rss.Transport, transport.Source, message.Publisher) {
		tp, err := rss.New(rss.Options{Server: rss.Server{URL: rd.url()}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, LeaseMS: 600000, HeartbeatMS: 300000,
			ReclaimIntervalMS: 600000, PollIntervalMS: 600000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		src, err := tp.Source(q)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := tp.Publisher(q)
		if err != nil {
			t.Fatal(err)
		}
		octx, stop := context.WithCancel(ctx)
		if err := src.Open(octx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stop(); _ = tp.Close(); _ = src.Close() })
		return tp, src, pub
	}
	tpA, srcA, pubA := open()
	tpB, srcB, pubB := open()
	claim := func(src transport.Source) *message.Message {
		ms, err := src.Claim(ctx, 1)
		if err != nil || len(ms) != 1 {
			t.Fatalf("claim: %v %v", ms, err)
		}
		return ms[0]
	}
	answer := func(d *message.Message, who string) *message.Message {
		res := message.NewMessage("res-"+d.UUID, (&wire.Result{ID: "p1", StatusCode: 200, Payload: `{"by":"` + who + `"}`}).Marshal())
		for key, v := range d.Metadata {
			res.Metadata.Set(key, v)
		}
		return res
	}
	dA := claim(srcA)

	// A's settle freezes at point.
	reached, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	rss.SetFaultHook(tpA, func(p int) error {
		if p == point {
			once.Do(func() { close(reached); <-release })
		}
		return nil
	})
	resA := answer(dA, "A")
	go func() { done <- pubA.Publish(q.ResultName, resA) }()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("A's settle did not reach the pause")
	}
	// A's lease runs out (it heartbeats no more), and B's reclaimer runs.
	if err := admin.ZAddXX(ctx, k.ClaimsIdx, redis.Z{Score: 1, Member: dA.Metadata.Get(rss.MetaClaim)}).Err(); err != nil {
		t.Fatal(err)
	}
	rss.Reclaim(tpB, q.Name)
	if point == rss.FaultBeforePrepare {
		dB := claim(srcB) // back in the queue: B claims and answers it
		if err := pubB.Publish(q.ResultName, answer(dB, "B")); err != nil {
			t.Fatal(err)
		}
		srcB.Settle(dB, true)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("A's resumed settle: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("A's resumed settle did not end")
	}
	srcA.Settle(dA, true)

	res, err := admin.LRange(ctx, q.ResultName, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"by":"A"}` // B's reclaimer finished A's settle with A's result
	if point == rss.FaultBeforePrepare {
		want = `{"by":"B"}` // A, stale, wrote nothing
	}
	if len(res) != 1 {
		t.Fatalf("results %q, want exactly one, %s", res, want)
	}
	if r, err := wire.DecodeResult([]byte(res[0])); err != nil || r.ID != "p1" || r.Payload != want {
		t.Fatalf("result %q (%v), want payload %s", res[0], err, want)
	}
	for _, key := range []string{k.Claimed, k.Owners, k.ClaimsIdx, k.Settling, q.Name} {
		if n := keyLen(t, admin, key); n != 0 {
			t.Errorf("%s holds %d entries after the settle", key, n)
		}
	}
	if late := tpA.Stats().LateResults; (point == rss.FaultBeforePrepare) != (late == 1) {
		t.Errorf("A counted %d late results", late)
	}
}
