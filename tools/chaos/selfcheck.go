package main

import (
	"context"
	"encoding/json"
	"time"
)

// runSelfcheck proves the harness sees a loss and a duplicate: 200
// requests on the sorted set, of which the harness itself removes one
// before sluice starts (so it is never answered) and to whose results it
// adds a copy of one (so one id has two). The line must say lost=1
// duplicated=1 and the run must fail; `-selfcheck` runs it alone.
func runSelfcheck(ctx context.Context, e *env) *verdict {
	tc := transportCases()[0]
	s, v := open(ctx, e, "selfcheck", tc, brokerTweak{}, gatewayFaults{})
	if s == nil {
		return v
	}
	defer s.close()
	ss := s.b.(*sortedSet)
	if err := s.b.send(ctx, s.goodMessages("s", 200, 10*time.Minute)); err != nil {
		v.fail("send: %v", err)
		return v
	}
	// Remove one waiting request: it can never be answered.
	if err := ss.c.ZPopMax(ctx, ss.queue, 1).Err(); err != nil {
		v.fail("remove a request: %v", err)
		return v
	}
	// Add a second result for one id.
	dup, _ := json.Marshal(map[string]any{"id": "s-00000", "status_code": 200, "payload": "{}"})
	if err := ss.c.LPush(ctx, ss.results, dup).Err(); err != nil {
		v.fail("add a result: %v", err)
		return v
	}
	cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, 32))
	if err != nil {
		v.fail("config: %v", err)
		return v
	}
	if _, err := s.r.startReplica("replica", cfgPath); err != nil {
		v.fail("%v", err)
		return v
	}
	s.waitComplete(ctx, 15*time.Second)
	s.quiet(ctx, 2*time.Second, 4*time.Second)
	v.t = s.l.tally()
	v.judge(0)
	v.extra["expected_lost"] = 1
	v.extra["expected_duplicated"] = 1
	return v
}
