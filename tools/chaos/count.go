package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// ledger records what a fault run sent and what came back: how many
// messages were sent per id (an id sent twice expects two results) and
// which result codes each may have, and every result read from the result
// destination, with its code and when it was read. It is the one place the
// CHAOS figures are counted from.
type ledger struct {
	mu sync.Mutex
	// okOnly: a result whose id has no codes of its own must be "ok" (the
	// fault's gateway answers every call with a 200).
	okOnly  bool
	sent    map[string]*expectation
	got     map[string][]string  // id → codes of the results read, in order
	codes   map[string]int       // result code ("ok", "http_503", error codes) → results
	firstAt map[string]time.Time // id → when its first result was read
	unknown int                  // results whose id was never sent
	total   int                  // results read
	// hist is the run's history (history.go): enqueues, gateway calls and
	// results, with their times; openEnq are the indexes in hist of the
	// enqueues whose send has not reported back, by id.
	hist     []histOp
	openEnq  map[string][]int
	firstEnq map[string]time.Time // id → when its first enqueue began
	// callsUnseen: the results do not come from the recording gateway
	// (the bare control), so no gateway call is expected before them.
	callsUnseen bool
}

// expectation is what the ledger expects for one id.
type expectation struct {
	n        int       // messages sent with the id
	kind     string    // the fuzzed kind ("" for a good request)
	codes    []string  // the result codes allowed (nil: as the ledger's okOnly says)
	anyCode  bool      // any code is allowed, whatever okOnly says
	deadline time.Time // the request's deadline (zero: not checked)
}

func newLedger(okOnly bool) *ledger {
	return &ledger{okOnly: okOnly, sent: map[string]*expectation{}, got: map[string][]string{}, codes: map[string]int{},
		firstAt: map[string]time.Time{}, openEnq: map[string][]int{}, firstEnq: map[string]time.Time{}}
}

// expect records one good message sent with id.
func (l *ledger) expect(id string, deadline time.Time) { l.expectAs(id, "", nil, deadline) }

// expectAs records one message sent with id, of a kind, whose results may
// carry only codes (nil: as okOnly says).
func (l *ledger) expectAs(id, kind string, codes []string, deadline time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.sent[id]
	if e == nil {
		e = &expectation{kind: kind, codes: codes}
		l.sent[id] = e
	}
	e.n++
	if !deadline.IsZero() {
		e.deadline = deadline
	}
	now := time.Now()
	if _, ok := l.firstEnq[id]; !ok {
		l.firstEnq[id] = now
	}
	l.openEnq[id] = append(l.openEnq[id], len(l.hist))
	l.hist = append(l.hist, histOp{kind: histEnqueue, id: id, call: now})
}

// sentDone notes that the send carrying ids returned at: their enqueues
// took effect by then.
func (l *ledger) sentDone(ids []string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		for _, i := range l.openEnq[id] {
			l.hist[i].ret = at
		}
		delete(l.openEnq, id)
	}
}

// dispatched notes one gateway call for id, from start to end.
func (l *ledger) dispatched(id string, start, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.callsUnseen {
		return // the calls cannot be told apart by id: none is recorded
	}
	l.hist = append(l.hist, histOp{kind: histDispatch, id: id, call: start, ret: end})
}

// firstEnqueueLocked is when id's first enqueue began (at when there is
// none).
func (l *ledger) firstEnqueueLocked(id string, at time.Time) time.Time {
	if t, ok := l.firstEnq[id]; ok && t.Before(at) {
		return t
	}
	return at
}

// linearizable checks the ledger's history against the queue-with-results
// model (history.go); atLeastOnce when the transport may repeat a result.
func (l *ledger) linearizable(atLeastOnce bool) linearity {
	l.mu.Lock()
	ops := append([]histOp(nil), l.hist...)
	r := historyRules{atLeastOnce: atLeastOnce, callsUnseen: l.callsUnseen}
	l.mu.Unlock()
	return checkHistory(ops, r, historyTimeout)
}

// record notes one result read at time at.
func (l *ledger) record(id, code string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	l.codes[code]++
	l.hist = append(l.hist, histOp{kind: histResult, id: id, code: code, call: l.firstEnqueueLocked(id, at), ret: at})
	if _, ok := l.sent[id]; !ok {
		l.unknown++
		return
	}
	l.got[id] = append(l.got[id], code)
	if _, ok := l.firstAt[id]; !ok {
		l.firstAt[id] = at
	}
}

// merge adds everything o recorded (another run of the same fault, with
// ids of its own) to l: expectations, results with their codes, results
// for ids never sent.
func (l *ledger) merge(o *ledger) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, e := range o.sent {
		x := l.sent[id]
		if x == nil {
			x = &expectation{kind: e.kind, codes: e.codes, anyCode: e.anyCode, deadline: e.deadline}
			if e.codes == nil && !e.anyCode && o.okOnly != l.okOnly {
				// Keep what o required of this id.
				if o.okOnly {
					x.codes = []string{"ok"}
				} else {
					x.anyCode = true
				}
			}
			l.sent[id] = x
		}
		x.n += e.n
	}
	for id, cs := range o.got {
		l.got[id] = append(l.got[id], cs...)
		if at, ok := o.firstAt[id]; ok {
			if mine, ok := l.firstAt[id]; !ok || at.Before(mine) {
				l.firstAt[id] = at
			}
		}
	}
	for c, n := range o.codes {
		l.codes[c] += n
	}
	l.unknown += o.unknown
	l.total += o.total
	l.hist = append(l.hist, o.hist...)
	for id, t := range o.firstEnq {
		if mine, ok := l.firstEnq[id]; !ok || t.Before(mine) {
			l.firstEnq[id] = t
		}
	}
	l.callsUnseen = l.callsUnseen || o.callsUnseen
}

// ids lists the ids sent, sorted.
func (l *ledger) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.sent))
	for id := range l.sent {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// sentID reports whether id was sent.
func (l *ledger) sentID(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.sent[id]
	return ok
}

// answeredBy reports whether id had a result read before t.
func (l *ledger) answeredBy(id string, t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.firstAt[id]
	return ok && at.Before(t)
}

// recoveredAfter is how long after t the last id sent got its first
// result, when every id has one (0 when that was before t); otherwise how
// long after t it is at now (still not recovered).
func (l *ledger) recoveredAfter(t, now time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := t
	for id := range l.sent {
		at, ok := l.firstAt[id]
		if !ok {
			return now.Sub(t).Seconds()
		}
		if at.After(last) {
			last = at
		}
	}
	return last.Sub(t).Seconds()
}

// complete reports whether every id sent has at least as many results as
// messages sent with it.
func (l *ledger) complete() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, e := range l.sent {
		if len(l.got[id]) < e.n {
			return false
		}
	}
	return true
}

// lateResults counts the ids whose first result was read more than slack
// after their request's deadline.
func (l *ledger) lateResults(slack time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	late := 0
	for id, at := range l.firstAt {
		if dl := l.sent[id].deadline; !dl.IsZero() && at.After(dl.Add(slack)) {
			late++
		}
	}
	return late
}

// allowed reports whether a result of code is allowed for e.
func (l *ledger) allowed(e *expectation, code string) bool {
	switch {
	case e.codes != nil:
		return slices.Contains(e.codes, code)
	case e.anyCode:
		return true
	case l.okOnly:
		return code == "ok"
	default:
		return true
	}
}

// tally is what a ledger counts.
type tally struct {
	requests   int // distinct ids sent
	answered   int // distinct ids with at least one result
	lost       int // ids with fewer results than messages sent with them
	duplicated int // ids with more results than messages sent with them
	extra      int // results beyond one per message, summed
	unknown    int // results for ids never sent
	wrongCode  int // ids with a result whose code is not allowed for them
	lostIDs    []string
	dupIDs     []string
	wrongIDs   []string // id=code of the first result not allowed, per id
	// l is the ledger counted (nil for a tally made by hand): judge
	// checks its history.
	l *ledger
}

func (l *ledger) tally() tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := tally{requests: len(l.sent), unknown: l.unknown, l: l}
	for id, e := range l.sent {
		got := l.got[id]
		g := len(got)
		if g > 0 {
			t.answered++
		}
		if g < e.n {
			t.lost++
			t.lostIDs = append(t.lostIDs, id)
		}
		if g > e.n {
			t.duplicated++
			t.extra += g - e.n
			t.dupIDs = append(t.dupIDs, id)
		}
		for _, c := range got {
			if !l.allowed(e, c) {
				t.wrongCode++
				t.wrongIDs = append(t.wrongIDs, id+"="+c)
				break
			}
		}
	}
	sort.Strings(t.lostIDs)
	sort.Strings(t.dupIDs)
	sort.Strings(t.wrongIDs)
	return t
}

// codeFigures returns the result codes as figures code_<name>=N.
func (l *ledger) codeFigures(f figures) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, n := range l.codes {
		f["code_"+strings.ToLower(c)] = float64(n)
	}
}

// figures are a fault's extra key=value figures, printed in key order.
type figures map[string]float64

// verdict is what a fault run reports: its tally, its extra figures,
// and the reasons it failed (none: it passed).
type verdict struct {
	name     string
	t        tally
	seconds  float64
	extra    figures
	failures []string
	// linear is the history check's verdict (nil: not checked, as for a
	// tally made by hand); the CHAOS line shows it as linearizable=.
	linear *linearity
}

// fail records why the fault failed.
func (v *verdict) fail(format string, args ...any) {
	v.failures = append(v.failures, fmt.Sprintf(format, args...))
}

// judge applies the common rules: any loss fails, and any duplicate fails
// unless dupAllowed (the transport may repeat a result on a crash) covers
// it; a result for an id never sent fails, and so does a result whose code
// the id does not allow (on a fault whose gateway answers 200, anything
// but "ok"). The figures wrong_code and unknown are always shown.
func (v *verdict) judge(dupAllowed int) { v.judgeExcusing(dupAllowed, 0, "") }

// judgeExcusing is judge with excused of the lost ids proven to be the
// broker's own loss (why says how): lost= still counts them, they do not
// fail the fault.
func (v *verdict) judgeExcusing(dupAllowed, excused int, why string) {
	if n := v.t.lost - excused; n > 0 {
		if excused > 0 {
			v.fail("%d ids lost (%d more proven %s; first: %s)", n, excused, why, firstFew(v.t.lostIDs))
		} else {
			v.fail("%d ids lost (first: %s)", n, firstFew(v.t.lostIDs))
		}
	}
	if v.t.duplicated > dupAllowed {
		v.fail("%d ids duplicated, %d allowed (first: %s)", v.t.duplicated, dupAllowed, firstFew(v.t.dupIDs))
	}
	if v.t.unknown > 0 {
		v.fail("%d results for ids never sent", v.t.unknown)
	}
	if v.t.wrongCode > 0 {
		v.fail("%d ids with a result code they do not allow (first: %s)", v.t.wrongCode, firstFew(v.t.wrongIDs))
	}
	if v.t.l != nil {
		lin := v.t.l.linearizable(dupAllowed > 0)
		v.linear = &lin
		switch {
		case lin.result == porcupine.Unknown && len(lin.badIDs) == 0:
			v.fail("the history (%d operations) was not proven linearizable within %s per id", lin.ops, historyTimeout)
		case !lin.ok:
			v.fail("the history is not linearizable against the queue-with-results model: %d ids (first: %s)", len(lin.badIDs), firstFew(lin.badIDs))
		}
	}
	v.extra["wrong_code"] = float64(v.t.wrongCode)
	v.extra["unknown"] = float64(v.t.unknown)
}

func firstFew(ids []string) string {
	if len(ids) > 5 {
		return strings.Join(ids[:5], ",") + ",..."
	}
	return strings.Join(ids, ",")
}

// line is the fault's CHAOS line.
func (v *verdict) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CHAOS %s requests=%d answered=%d lost=%d duplicated=%d seconds=%s",
		v.name, v.t.requests, v.t.answered, v.t.lost, v.t.duplicated, strconv.FormatFloat(v.seconds, 'f', 1, 64))
	keys := make([]string, 0, len(v.extra))
	for k := range v.extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x := v.extra[k]
		if x == float64(int64(x)) {
			fmt.Fprintf(&b, " %s=%d", k, int64(x))
		} else {
			fmt.Fprintf(&b, " %s=%s", k, strconv.FormatFloat(x, 'f', 2, 64))
		}
	}
	if v.linear != nil {
		fmt.Fprintf(&b, " linearizable=%t", v.linear.ok)
	}
	if len(v.failures) > 0 {
		fmt.Fprintf(&b, " result=FAIL")
	} else {
		fmt.Fprintf(&b, " result=ok")
	}
	return b.String()
}
