package headroom

// The requests waiting for a pod, served earliest deadline first.
//
// With dispatch "pods" a request that finds no pod with room waits in
// flight and asks again (gate.Wait). The pipeline keeps many requests in
// flight, fetched in deadline order, but which of them asks first when a
// pod opens is chance: under a tight pace (pace_tokens on pods at vLLM's
// defaults) a request due in a minute competed with a thousand due in an
// hour, and missed its deadline while the batch ran at full pace. So the
// gate remembers who waits: when n pods can take a request now, only the
// n waiting requests due first may be placed; the others wait on. A
// waiter that stops asking (its call cancelled, its lane gone) is
// forgotten after a few refresh intervals without a question (staleAfter),
// so it never blocks the queue for longer.

import (
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// staleWaits is how many refresh intervals a waiter may go without asking
// before it is forgotten (it asks again at least once an interval).
const staleWaits = 3

// waiter is one request waiting for a pod.
type waiter struct {
	due   time.Time // its deadline (zero: none, served last)
	id    string
	asked time.Time // its last question
}

// before orders waiters by deadline (none last), then id.
func (w waiter) before(o waiter) bool {
	switch {
	case w.due.IsZero() != o.due.IsZero():
		return o.due.IsZero()
	case !w.due.Equal(o.due):
		return w.due.Before(o.due)
	}
	return strings.Compare(w.id, o.id) < 0
}

// waiters are the requests waiting for a pod, in deadline order. Not safe
// for concurrent use (the gate's mutex guards it).
type waiters struct {
	list []waiter
}

// find returns where w is (or would be) in the list, and whether it is.
func (ws *waiters) find(w waiter) (int, bool) {
	i, _ := slices.BinarySearchFunc(ws.list, w, func(a, b waiter) int {
		switch {
		case a.before(b):
			return -1
		case b.before(a):
			return 1
		}
		return 0
	})
	return i, i < len(ws.list) && ws.list[i].id == w.id && ws.list[i].due.Equal(w.due)
}

// ahead records that w asks at now and reports whether fewer than slots
// live waiters are due before it: then it may take one of the slots. The
// stale waiters found before it are dropped on the way.
func (ws *waiters) ahead(w waiter, now time.Time, stale time.Duration, slots int) bool {
	w.asked = now
	i, ok := ws.find(w)
	if ok {
		ws.list[i].asked = now
	} else {
		ws.list = slices.Insert(ws.list, i, w)
	}
	live := 0
	for k := 0; k < i && live < slots; {
		if now.Sub(ws.list[k].asked) > stale {
			ws.list = slices.Delete(ws.list, k, k+1)
			i--
			continue
		}
		live++
		k++
	}
	return live < slots
}

// done forgets w (placed, or gone back to the queue).
func (ws *waiters) done(w waiter) {
	if w.id == "" {
		return
	}
	if i, ok := ws.find(w); ok {
		ws.list = slices.Delete(ws.list, i, i+1)
	}
}

// holds reports whether the first n live waiters (stale ones forgotten on
// the way) fill n places without w: then w may not take one.
func (ws *waiters) holds(w waiter, now time.Time, stale time.Duration, n int) bool {
	live := 0
	for k := 0; k < len(ws.list) && live < n; {
		switch {
		case now.Sub(ws.list[k].asked) > stale:
			ws.list = slices.Delete(ws.list, k, k+1)
			continue
		case w.id != "" && ws.list[k].id == w.id:
			return false
		}
		live++
		k++
	}
	return live >= n
}

// sweep forgets every waiter that has not asked within stale.
func (ws *waiters) sweep(now time.Time, stale time.Duration) {
	ws.list = slices.DeleteFunc(ws.list, func(w waiter) bool { return now.Sub(w.asked) > stale })
}

// waiterOf is req as a waiter; its id is empty (not remembered) when req
// is nil or has no id.
func waiterOf(req *wire.Request) waiter {
	if req == nil || req.ID == "" {
		return waiter{}
	}
	return waiter{due: req.Deadline, id: req.ID}
}
