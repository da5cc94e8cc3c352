package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// selfcheckRequests is the size of the self-check's run.
const selfcheckRequests = 200

// plantedWant are the figures the self-check's planted faults must
// produce, exactly.
func plantedWant() tally {
	return tally{requests: selfcheckRequests, answered: selfcheckRequests - 1, lost: 1, duplicated: 1, wrongCode: 1, unknown: 1}
}

// runSelfcheck proves the harness sees what it is there to see, on the
// real thing: 200 requests on the sorted set, with faults the harness
// plants itself before sluice starts — one request removed from the queue
// (never answered: lost=1), one removed and answered with an error result
// written by the harness (wrong_code=1), a second result added for one id
// (duplicated=1), a result for an id never sent (unknown=1), and one
// removed and answered "ok" by the harness, a result the counts cannot
// tell from sluice's but the history can: no gateway call of its id came
// before it. The history check must find exactly three ids not
// linearizable (linearizable=false): the unknown one, the duplicated one
// (its second result, answered before any call) and the forged one. The
// planted run must report exactly these figures and fail for exactly
// these four reasons; the self-check passes (result=ok, exit status 0 with
// -selfcheck) only then. `make chaos` runs it first.
func runSelfcheck(ctx context.Context, e *env) *verdict {
	planted, forged := plantedRun(ctx, e)
	return checkPlanted(planted, forged)
}

// checkPlanted is the self-check's verdict on the planted run pv: its
// figures are shown as they are, and it passes only when they are exactly
// plantedWant and pv failed for exactly the planted reasons, its history
// check naming exactly the planted ids (forged: the id answered "ok" by
// the harness).
func checkPlanted(pv *verdict, forged string) *verdict {
	v := &verdict{t: pv.t, extra: figures{}}
	for k, x := range pv.extra {
		v.extra[k] = x
	}
	w := plantedWant()
	v.extra["expected_lost"] = float64(w.lost)
	v.extra["expected_duplicated"] = float64(w.duplicated)
	v.extra["expected_wrong_code"] = float64(w.wrongCode)
	v.extra["expected_unknown"] = float64(w.unknown)
	got := pv.t
	if got.requests != w.requests || got.answered != w.answered || got.lost != w.lost || got.duplicated != w.duplicated ||
		got.wrongCode != w.wrongCode || got.unknown != w.unknown {
		v.fail("the planted faults were not counted exactly: requests=%d answered=%d lost=%d duplicated=%d wrong_code=%d unknown=%d, want %d %d %d %d %d %d",
			got.requests, got.answered, got.lost, got.duplicated, got.wrongCode, got.unknown,
			w.requests, w.answered, w.lost, w.duplicated, w.wrongCode, w.unknown)
	}
	wantReasons := []string{"1 ids lost", "1 ids duplicated, 0 allowed", "1 results for ids never sent", "1 ids with a result code they do not allow",
		"the history is not linearizable against the queue-with-results model: 3 ids"}
	v.linear = pv.linear
	if pv.linear == nil {
		v.fail("the planted run's history was not checked")
	} else if want := plantedNonLinear(forged); !slices.Equal(pv.linear.badIDs, want) {
		v.fail("the history check found ids %q not linearizable, want exactly %q", pv.linear.badIDs, want)
	}
	if len(pv.failures) != len(wantReasons) {
		v.fail("the planted run failed for %d reasons, want %d: %q", len(pv.failures), len(wantReasons), pv.failures)
	} else {
		for i, r := range wantReasons {
			if !strings.HasPrefix(pv.failures[i], r) {
				v.fail("the planted run's reason %d is %q, want %q...", i+1, pv.failures[i], r)
			}
		}
	}
	for _, f := range pv.failures {
		fmt.Fprintf(os.Stderr, "chaos: selfcheck: the planted run failed, as it must: %s\n", f)
	}
	detected := 0.0
	if len(v.failures) == 0 {
		detected = 1
	}
	v.extra["detected"] = detected
	return v
}

// plantedRun is the self-check's run with its planted faults; it returns
// the id it answered "ok" itself ("" when it got that far).
func plantedRun(ctx context.Context, e *env) (_ *verdict, forged string) {
	tc := transportCases()[0]
	s, v := open(ctx, e, "selfcheck", tc, brokerTweak{}, gatewayFaults{})
	if s == nil {
		return v, ""
	}
	defer s.close()
	ss := s.b.(*sortedSet)
	if err := s.send(ctx, s.goodMessages("s", selfcheckRequests, 10*time.Minute)); err != nil {
		v.fail("send: %v", err)
		return v, ""
	}
	// Remove three waiting requests: none can be answered by sluice.
	popped, err := ss.c.ZPopMax(ctx, ss.queue, 3).Result()
	if err != nil || len(popped) != 3 {
		v.fail("remove three requests: %v (%d removed)", err, len(popped))
		return v, ""
	}
	var removed [3]string
	for i := range removed {
		if removed[i] = memberID(fmt.Sprint(popped[i].Member)); removed[i] == "" {
			v.fail("no id in the removed member %.80q", popped[i].Member)
			return v, ""
		}
	}
	wrongID, forgedID := removed[1], removed[2]
	// The second of them gets an error result, the third an "ok" no call
	// produced; s-00000 a second result; an id never sent one.
	for _, r := range []map[string]any{
		{"id": wrongID, "payload": "{}", "error_code": "INFERENCE_ERROR"},
		{"id": forgedID, "status_code": 200, "payload": "{}"},
		{"id": "s-00000", "status_code": 200, "payload": "{}"},
		{"id": "never-sent", "status_code": 200, "payload": "{}"},
	} {
		b, _ := json.Marshal(r)
		if err := ss.c.LPush(ctx, ss.results, b).Err(); err != nil {
			v.fail("add a result: %v", err)
			return v, ""
		}
	}
	cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, 32))
	if err != nil {
		v.fail("config: %v", err)
		return v, ""
	}
	if _, err := s.r.startReplica("replica", cfgPath); err != nil {
		v.fail("%v", err)
		return v, ""
	}
	s.waitComplete(ctx, 15*time.Second)
	s.quiet(ctx, 2*time.Second, 4*time.Second)
	v.t = s.l.tally()
	v.judge(0)
	s.l.codeFigures(v.extra)
	return v, forgedID
}

// plantedNonLinear are the ids whose history the planted run breaks,
// sorted (forged: the id answered "ok" by the harness).
func plantedNonLinear(forged string) []string {
	ids := []string{"never-sent", "s-00000", forged}
	slices.Sort(ids)
	return ids
}

// memberID reads the request id of a sorted-set member (the request's
// JSON behind the queue's own prefix).
func memberID(member string) string {
	_, rest, ok := strings.Cut(member, `"id":"`)
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, `"`)
	return id
}
