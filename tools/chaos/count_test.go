package main

import (
	"strings"
	"testing"
	"time"
)

// TestLedgerCounts feeds the ledger known sets and checks every figure and
// the verdict: a loss and a duplicate must fail the fault; duplicates
// within what the transport allows must not.
func TestLedgerCounts(t *testing.T) {
	cases := []struct {
		name       string
		sent       []string
		got        []string
		dupAllowed int
		okOnly     bool // the ledger requires "ok" (got entries are id or id=code)
		want       tally
		wantFail   []string
	}{
		{name: "all once", sent: []string{"a", "b", "c"}, got: []string{"c", "a", "b"},
			want: tally{requests: 3, answered: 3}},
		{name: "one lost", sent: []string{"a", "b", "c"}, got: []string{"a", "c"},
			want: tally{requests: 3, answered: 2, lost: 1, lostIDs: []string{"b"}}, wantFail: []string{"1 ids lost (first: b)"}},
		{name: "one duplicated", sent: []string{"a", "b"}, got: []string{"a", "b", "b", "b"},
			want: tally{requests: 2, answered: 2, duplicated: 1, extra: 2, dupIDs: []string{"b"}}, wantFail: []string{"1 ids duplicated, 0 allowed", "the history is not linearizable against the queue-with-results model: 1 ids (first: b)"}},
		{name: "duplicate allowed", sent: []string{"a", "b"}, got: []string{"a", "b", "b"}, dupAllowed: 1,
			want: tally{requests: 2, answered: 2, duplicated: 1, extra: 1, dupIDs: []string{"b"}}},
		{name: "id sent twice answered twice", sent: []string{"a", "a", "b"}, got: []string{"a", "b", "a"},
			want: tally{requests: 2, answered: 2}},
		{name: "id sent twice answered once", sent: []string{"a", "a"}, got: []string{"a"},
			want: tally{requests: 1, answered: 1, lost: 1, lostIDs: []string{"a"}}, wantFail: []string{"1 ids lost"}},
		{name: "unknown id", sent: []string{"a"}, got: []string{"a", "zz"},
			want: tally{requests: 1, answered: 1, unknown: 1}, wantFail: []string{"1 results for ids never sent", "the history is not linearizable against the queue-with-results model: 1 ids (first: zz)"}},
		{name: "nothing back", sent: []string{"a", "b"},
			want: tally{requests: 2, lost: 2, lostIDs: []string{"a", "b"}}, wantFail: []string{"2 ids lost"}},
		{name: "wrong code on a 200-only gateway", okOnly: true, sent: []string{"a", "b"}, got: []string{"a", "b=INFERENCE_ERROR"},
			want:     tally{requests: 2, answered: 2, wrongCode: 1, wrongIDs: []string{"b=INFERENCE_ERROR"}},
			wantFail: []string{"1 ids with a result code they do not allow (first: b=INFERENCE_ERROR)"}},
		{name: "a second result with a wrong code", okOnly: true, sent: []string{"a"}, got: []string{"a", "a=http_503"},
			want:     tally{requests: 1, answered: 1, duplicated: 1, extra: 1, dupIDs: []string{"a"}, wrongCode: 1, wrongIDs: []string{"a=http_503"}},
			wantFail: []string{"1 ids duplicated", "1 ids with a result code", "the history is not linearizable against the queue-with-results model: 1 ids (first: a)"}},
		{name: "any code on a faulty gateway", sent: []string{"a", "b"}, got: []string{"a=http_503", "b=DEADLINE_EXCEEDED"},
			want: tally{requests: 2, answered: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLedger(c.okOnly)
			l.callsUnseen = true // no gateway: the results are recorded here
			for _, id := range c.sent {
				l.expect(id, time.Time{})
			}
			now := time.Now() // the results are read after the requests were sent
			for _, g := range c.got {
				id, code, ok := strings.Cut(g, "=")
				if !ok {
					code = "ok"
				}
				l.record(id, code, now)
			}
			got := l.tally()
			if !equalTally(got, c.want) {
				t.Errorf("tally = %+v, want %+v", got, c.want)
			}
			if wantComplete := c.want.lost == 0; l.complete() != wantComplete {
				t.Errorf("complete() = %v, want %v", l.complete(), wantComplete)
			}
			v := &verdict{name: "x", t: got, extra: figures{}}
			v.judge(c.dupAllowed)
			if len(v.failures) != len(c.wantFail) {
				t.Fatalf("failures = %q, want %d matching %q", v.failures, len(c.wantFail), c.wantFail)
			}
			for i, f := range c.wantFail {
				if !strings.Contains(v.failures[i], f) {
					t.Errorf("failure %q does not contain %q", v.failures[i], f)
				}
			}
			line := v.line()
			wantResult := "result=ok"
			if len(c.wantFail) > 0 {
				wantResult = "result=FAIL"
			}
			if !strings.HasSuffix(line, wantResult) {
				t.Errorf("line %q does not end with %s", line, wantResult)
			}
		})
	}
}

func equalTally(a, b tally) bool {
	return a.requests == b.requests && a.answered == b.answered && a.lost == b.lost && a.duplicated == b.duplicated &&
		a.extra == b.extra && a.unknown == b.unknown && strings.Join(a.lostIDs, ",") == strings.Join(b.lostIDs, ",") &&
		strings.Join(a.dupIDs, ",") == strings.Join(b.dupIDs, ",") && a.wrongCode == b.wrongCode &&
		strings.Join(a.wrongIDs, ",") == strings.Join(b.wrongIDs, ",")
}

// TestLine checks the CHAOS line's shape: the fixed figures first, then the
// extra ones in key order.
func TestLine(t *testing.T) {
	v := &verdict{name: "kill9-x", t: tally{requests: 10, answered: 9, lost: 1}, seconds: 12.345,
		extra: figures{"z_last": 2, "a_first": 0.5}}
	v.judge(0)
	want := "CHAOS kill9-x requests=10 answered=9 lost=1 duplicated=0 seconds=12.3 a_first=0.50 unknown=0 wrong_code=0 z_last=2 result=FAIL"
	if got := v.line(); got != want {
		t.Errorf("line\n got %s\nwant %s", got, want)
	}
}

// TestAnsweredBy checks the instant a result counts as read, which the
// in-flight-at-kill figure depends on.
func TestAnsweredBy(t *testing.T) {
	l := newLedger(false)
	l.expect("a", time.Time{})
	t0 := time.Now()
	l.record("a", "ok", t0)
	l.record("a", "ok", t0.Add(time.Hour)) // a later duplicate does not move the first read
	if l.answeredBy("a", t0) {
		t.Error("answeredBy(a, t0) = true, want false (read at t0, not before)")
	}
	if !l.answeredBy("a", t0.Add(time.Millisecond)) {
		t.Error("answeredBy(a, t0+1ms) = false, want true")
	}
	if l.answeredBy("b", t0.Add(time.Hour)) {
		t.Error("answeredBy(b) = true for an id never answered")
	}
}

// TestResultID checks how results are classified.
func TestResultID(t *testing.T) {
	for _, c := range []struct{ in, id, code string }{
		{`{"id":"a","status_code":200,"payload":"x"}`, "a", "ok"},
		{`{"id":"b","status_code":503,"payload":"x"}`, "b", "http_503"},
		{`{"id":"c","payload":"{}","error_code":"INVALID_REQUEST"}`, "c", "INVALID_REQUEST"},
		{`not json`, "", "undecodable"},
	} {
		id, code := resultID([]byte(c.in))
		if id != c.id || code != c.code {
			t.Errorf("resultID(%s) = %q, %q; want %q, %q", c.in, id, code, c.id, c.code)
		}
	}
}

// TestCheckSchedule feeds the schedule check known gaps: on time, too
// early, too late, and a 429 whose Retry-After wins over the backoff.
func TestCheckSchedule(t *testing.T) {
	t0 := time.Unix(1000, 0)
	call := func(startMs, endMs int, outcome string) attempt {
		return attempt{start: t0.Add(time.Duration(startMs) * time.Millisecond), end: t0.Add(time.Duration(endMs) * time.Millisecond), outcome: outcome}
	}
	calls := map[string][]attempt{
		// retry 0 after 200 ms (base), retry 1 after 400 ms: on time.
		"good": {call(0, 10, "503"), call(210, 220, "reset"), call(620, 630, "ok")},
		// retry 0 after 20 ms: early by 140 ms past the 160 ms floor.
		"early": {call(0, 10, "503"), call(30, 40, "ok")},
		// retry 0 after 2 s: late.
		"late": {call(0, 10, "stall"), call(2010, 2020, "ok")},
		// a 429 (Retry-After 1 s): 1 s later is on time, 250 ms is early.
		"ra-ok":    {call(0, 10, "429"), call(1010, 1020, "ok")},
		"ra-early": {call(0, 10, "429"), call(260, 270, "ok")},
		"single":   {call(0, 10, "ok")},
	}
	sc := checkSchedule(calls)
	if sc.retries != 6 {
		t.Errorf("retries = %d, want 6", sc.retries)
	}
	if sc.violations != 3 {
		t.Errorf("violations = %d, want 3 (early, late, ra-early)", sc.violations)
	}
	if sc.byOutcome["503"] != 1 || sc.byOutcome["stall"] != 1 || sc.byOutcome["429"] != 1 {
		t.Errorf("by outcome = %v, want one each after 503, stall, 429", sc.byOutcome)
	}
	if !strings.HasPrefix(sc.first, "early ") {
		t.Errorf("first violation %q, want the id early (ids in order)", sc.first)
	}
}

// TestRecoveredAfter checks the recovery figure: when the last first
// result came, or how long it has been when one is still missing.
func TestRecoveredAfter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := newLedger(false)
	l.expect("a", time.Time{})
	l.expect("b", time.Time{})
	l.record("a", "ok", t0.Add(-time.Second)) // before the kill
	if got := l.recoveredAfter(t0, t0.Add(9*time.Second)); got != 9 {
		t.Errorf("with b missing: %v, want 9 (still waiting)", got)
	}
	l.record("b", "ok", t0.Add(2500*time.Millisecond))
	l.record("b", "ok", t0.Add(5*time.Second)) // a duplicate does not move it
	if got := l.recoveredAfter(t0, t0.Add(9*time.Second)); got != 2.5 {
		t.Errorf("recovered: %v, want 2.5", got)
	}
}
