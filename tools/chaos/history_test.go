package main

import (
	"strings"
	"testing"
	"time"
)

// TestHistoryCheck feeds the queue-with-results model good and bad
// histories: the good pass whatever order their concurrent operations
// took effect in, each bad one is caught and names exactly the ids that
// break the model.
func TestHistoryCheck(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	enq := func(id string, call, ret int) histOp {
		return histOp{kind: histEnqueue, id: id, call: at(call), ret: at(ret)}
	}
	call := func(id string, start, end int) histOp {
		return histOp{kind: histDispatch, id: id, call: at(start), ret: at(end)}
	}
	res := func(id, code string, from, read int) histOp {
		return histOp{kind: histResult, id: id, code: code, call: at(from), ret: at(read)}
	}
	cases := []struct {
		name  string
		rules historyRules
		ops   []histOp
		bad   []string // the ids not linearizable (none: the history is)
	}{
		{name: "one request, called, answered", ops: []histOp{enq("a", 0, 1), call("a", 5, 9), res("a", "ok", 0, 12)}},
		{name: "many ids, interleaved", ops: []histOp{
			enq("a", 0, 3), enq("b", 0, 3), call("b", 4, 8), call("a", 5, 7), res("a", "ok", 0, 9), res("b", "http_503", 0, 9)}},
		{name: "a call that overlaps the read", ops: []histOp{enq("a", 0, 1), call("a", 5, 20), res("a", "ok", 0, 6)}},
		{name: "an enqueue still open at the end", ops: []histOp{{kind: histEnqueue, id: "a", call: at(0)}, call("a", 5, 6), res("a", "ok", 0, 7)}},
		{name: "a redelivery: two calls, one result", ops: []histOp{enq("a", 0, 1), call("a", 2, 3), call("a", 4, 5), res("a", "ok", 0, 6)}},
		{name: "sent twice, answered twice", ops: []histOp{enq("a", 0, 1), enq("a", 2, 3), call("a", 4, 5), res("a", "ok", 0, 6), res("a", "ok", 0, 7)}},
		{name: "an error result needs no call", ops: []histOp{enq("a", 0, 1), res("a", "DEADLINE_EXCEEDED", 0, 2)}},
		{name: "no results yet", ops: []histOp{enq("a", 0, 1), call("a", 2, 3)}},
		{name: "a second result", ops: []histOp{enq("a", 0, 1), call("a", 2, 3), res("a", "ok", 0, 4), res("a", "ok", 0, 5), enq("b", 0, 1), res("b", "INVALID", 0, 2)},
			bad: []string{"a"}},
		{name: "a second result, at least once", rules: historyRules{atLeastOnce: true},
			ops: []histOp{enq("a", 0, 1), call("a", 2, 3), res("a", "ok", 0, 4), res("a", "ok", 0, 5)}},
		{name: "a result for an id never sent", ops: []histOp{enq("a", 0, 1), call("a", 2, 3), res("a", "ok", 0, 4), res("zz", "ok", 4, 4)},
			bad: []string{"zz"}},
		{name: "never sent, at least once", rules: historyRules{atLeastOnce: true}, ops: []histOp{res("zz", "ok", 4, 4)}, bad: []string{"zz"}},
		{name: "an answer before any call", ops: []histOp{enq("a", 0, 1), res("a", "ok", 0, 4), call("a", 6, 7)}, bad: []string{"a"}},
		{name: "an answer before any call, calls unseen", rules: historyRules{callsUnseen: true},
			ops: []histOp{enq("a", 0, 1), res("a", "ok", 0, 4)}},
		{name: "a result read before its enqueue began", ops: []histOp{res("a", "DEADLINE_EXCEEDED", 0, 2), enq("a", 5, 6)}, bad: []string{"a"}},
		{name: "a call before its enqueue began", ops: []histOp{call("a", 0, 1), enq("a", 5, 6)}, bad: []string{"a"}},
		{name: "two bad among good", ops: []histOp{enq("a", 0, 1), enq("b", 0, 1), enq("c", 0, 1), call("a", 2, 3), call("c", 2, 3),
			res("a", "ok", 0, 4), res("b", "ok", 0, 4), res("c", "ok", 0, 4), res("c", "ok", 0, 5)}, bad: []string{"b", "c"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lin := checkHistory(c.ops, c.rules, 5*time.Second)
			if lin.ok != (len(c.bad) == 0) || strings.Join(lin.badIDs, ",") != strings.Join(c.bad, ",") {
				t.Errorf("linearizable=%v, bad ids %q; want bad ids %q", lin.ok, lin.badIDs, c.bad)
			}
			if lin.ops != len(c.ops) {
				t.Errorf("%d operations checked, want %d", lin.ops, len(c.ops))
			}
		})
	}
}

// TestLedgerHistory: the ledger's own history (expect, sentDone, the
// gateway's calls, record) is checked by judge, shown in the CHAOS line
// and fails the fault when it is not linearizable.
func TestLedgerHistory(t *testing.T) {
	run := func(answerBeforeCall bool) *verdict {
		l := newLedger(true)
		l.expect("a", time.Time{})
		l.expect("b", time.Time{})
		l.sentDone([]string{"a", "b"}, time.Now())
		if answerBeforeCall {
			l.record("b", "ok", time.Now()) // b answered before any call of it
		}
		start := time.Now().Add(time.Millisecond)
		l.dispatched("a", start, start.Add(time.Millisecond))
		l.dispatched("b", start, start.Add(time.Millisecond))
		l.record("a", "ok", start.Add(2*time.Millisecond))
		if !answerBeforeCall {
			l.record("b", "ok", start.Add(2*time.Millisecond))
		}
		v := &verdict{name: "x", t: l.tally(), extra: figures{}}
		v.judge(0)
		return v
	}
	if v := run(false); len(v.failures) != 0 || !strings.HasSuffix(v.line(), " linearizable=true result=ok") {
		t.Errorf("good history: failures %q, line %q", v.failures, v.line())
	}
	v := run(true)
	if len(v.failures) != 1 || !strings.Contains(v.failures[0], "not linearizable") || !strings.Contains(v.failures[0], "(first: b)") ||
		!strings.HasSuffix(v.line(), " linearizable=false result=FAIL") {
		t.Errorf("an answer before its call: failures %q, line %q", v.failures, v.line())
	}
}
