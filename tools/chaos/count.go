package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ledger records what a fault run sent and what came back: how many
// messages were sent per id (an id sent twice expects two results), and
// every result read from the result destination, with its code and when
// it was read. It is the one place the CHAOS figures are counted from.
type ledger struct {
	mu       sync.Mutex
	sent     map[string]int       // id → messages sent with it
	got      map[string]int       // id → results read
	codes    map[string]int       // result code ("ok", "http_503", error codes) → results
	firstAt  map[string]time.Time // id → when its first result was read
	unknown  int                  // results whose id was never sent
	total    int                  // results read
	deadline map[string]time.Time // id → the request's deadline (when the fault checks it)
}

func newLedger() *ledger {
	return &ledger{sent: map[string]int{}, got: map[string]int{}, codes: map[string]int{},
		firstAt: map[string]time.Time{}, deadline: map[string]time.Time{}}
}

// expect records one message sent with id (fuzzed messages are not
// recorded: the fuzz case counts them in bulk).
func (l *ledger) expect(id string, deadline time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent[id]++
	if !deadline.IsZero() {
		l.deadline[id] = deadline
	}
}

// record notes one result read at time at.
func (l *ledger) record(id, code string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	l.codes[code]++
	if _, ok := l.sent[id]; !ok {
		l.unknown++
		return
	}
	l.got[id]++
	if _, ok := l.firstAt[id]; !ok {
		l.firstAt[id] = at
	}
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
	for id, n := range l.sent {
		if l.got[id] < n {
			return false
		}
	}
	return true
}

// tally is what a ledger counts.
type tally struct {
	requests   int // distinct ids sent
	answered   int // distinct ids with at least one result
	lost       int // ids with fewer results than messages sent with them
	duplicated int // ids with more results than messages sent with them
	extra      int // results beyond one per message, summed
	unknown    int // results for ids never sent
	lostIDs    []string
	dupIDs     []string
}

func (l *ledger) tally() tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := tally{requests: len(l.sent), unknown: l.unknown}
	for id, n := range l.sent {
		g := l.got[id]
		if g > 0 {
			t.answered++
		}
		if g < n {
			t.lost++
			t.lostIDs = append(t.lostIDs, id)
		}
		if g > n {
			t.duplicated++
			t.extra += g - n
			t.dupIDs = append(t.dupIDs, id)
		}
	}
	sort.Strings(t.lostIDs)
	sort.Strings(t.dupIDs)
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
}

// fail records why the fault failed.
func (v *verdict) fail(format string, args ...any) {
	v.failures = append(v.failures, fmt.Sprintf(format, args...))
}

// judge applies the common rules: any loss fails, and any duplicate fails
// unless dupAllowed (the transport may repeat a result on a crash) covers
// it; an id never sent that came back fails too.
func (v *verdict) judge(dupAllowed int) {
	if v.t.lost > 0 {
		v.fail("%d ids lost (first: %s)", v.t.lost, firstFew(v.t.lostIDs))
	}
	if v.t.duplicated > dupAllowed {
		v.fail("%d ids duplicated, %d allowed (first: %s)", v.t.duplicated, dupAllowed, firstFew(v.t.dupIDs))
	}
	if v.t.unknown > 0 {
		v.fail("%d results for ids never sent", v.t.unknown)
	}
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
	if len(v.failures) > 0 {
		fmt.Fprintf(&b, " result=FAIL")
	} else {
		fmt.Fprintf(&b, " result=ok")
	}
	return b.String()
}
