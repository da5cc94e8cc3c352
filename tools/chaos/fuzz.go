package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// fuzzMessages and fuzzGood size the fuzz case of each transport: 10,000
// fuzzed messages mixed with good ones.
const (
	fuzzMessages = 10_000
	fuzzGood     = 2_000
)

// fuzzKind is one kind of fuzzed message: how message i is made (unique
// bytes: a sorted set would merge equal members) and what must become of
// it. A message whose id can be read (encoding/json reads a string id, at
// the top or in an envelope's data) gets a result with code; one whose id
// cannot be read (dead) is dead-lettered, byte for byte.
type fuzzKind struct {
	name string
	dead bool
	code string // the one result code allowed (when !dead)
	make func(rng *rand.Rand, i int, dl int64) []byte
}

// fuzzKinds are the kinds of fuzzed message, drawn in turn.
var fuzzKinds = []fuzzKind{
	{"oversized", false, "ok", func(_ *rand.Rand, i int, dl int64) []byte {
		// One in forty is 1 MiB of prompt; the others 16 KiB, so 10,000 stay affordable.
		n := 16 << 10
		if i%40 == 0 {
			n = 1 << 20
		}
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":{"model":"m","prompt":"%s"}}`, i, dl, strings.Repeat("x", n))
	}},
	{"deep-nesting", true, "", func(_ *rand.Rand, i int, dl int64) []byte {
		d := 12_000 // past encoding/json's limit of 10,000
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":%s1%s}`, i, dl, strings.Repeat("[", d), strings.Repeat("]", d))
	}},
	{"deep-metadata", false, "INVALID_REQUEST", func(_ *rand.Rand, i int, dl int64) []byte {
		d := 2_000
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":{},"metadata":%s"x"%s}`, i, dl, strings.Repeat(`{"a":`, d), strings.Repeat("}", d))
	}},
	{"invalid-utf8", false, "ok", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, "{\"id\":\"f-%d\",\"deadline\":%d,\"payload\":{\"model\":\"m\",\"prompt\":\"\xff\xfe\xc3\x28\"},\"metadata\":{\"k\":\"\xed\xa0\x80\"}}", i, dl)
	}},
	{"invalid-utf8-id", false, "ok", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, "{\"id\":\"f-%d-\xff\xfe\",\"deadline\":%d,\"payload\":{}}", i, dl)
	}},
	{"wrong-type-id", true, "", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":%d,"deadline":%d,"payload":{}}`, 1_000_000+i, dl)
	}},
	{"wrong-type-deadline", false, "INVALID_REQUEST", func(_ *rand.Rand, i int, _ int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":"tomorrow","payload":{}}`, i)
	}},
	{"wrong-type-metadata", false, "INVALID_REQUEST", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":{},"metadata":[1,2,3],"headers":"x"}`, i, dl)
	}},
	{"wrong-type-payload", false, "INVALID_REQUEST", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":"not an object"}`, i, dl)
	}},
	{"duplicate-id", false, "ok", func(_ *rand.Rand, i int, dl int64) []byte {
		// Two messages per id (this one and the next of its kind share it).
		return fmt.Appendf(nil, `{"id":"f-dup-%d","deadline":%d,"payload":{"n":%d},"headers":{"X-Chaos-Id":"f-dup"}}`, i/(2*17), dl, i)
	}},
	{"missing-id", true, "", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"deadline":%d,"payload":{"n":%d}}`, dl, i)
	}},
	{"empty-id", true, "", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":"","deadline":%d,"payload":{"n":%d}}`, dl, i)
	}},
	{"garbage", true, "", func(rng *rand.Rand, i int, _ int64) []byte {
		b := make([]byte, 16+rng.IntN(512))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		return append(fmt.Appendf(nil, "%d:", i), b...)
	}},
	{"truncated", true, "", func(_ *rand.Rand, i int, dl int64) []byte {
		b := flatRequest(fmt.Sprintf("f-%d", i), time.Unix(dl, 0))
		return b[:len(b)/2]
	}},
	{"not-an-object", true, "", func(_ *rand.Rand, i int, _ int64) []byte {
		return fmt.Appendf(nil, `[%d,"id",null]`, i)
	}},
	{"envelope-wrong-kind", false, "INVALID_REQUEST", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"request_kind":"banana","internal":{"retry_count":"x"},"data":{"id":"f-%d","deadline":%d}}`, i, dl)
	}},
	{"past-deadline", false, "DEADLINE_EXCEEDED", func(_ *rand.Rand, i int, _ int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":1,"payload":{}}`, i)
	}},
}

// fuzzMsg is one fuzzed message: its kind, the id it carries ("" when it
// cannot be read: it must be dead-lettered) and its bytes.
type fuzzMsg struct {
	kind *fuzzKind
	id   string
	body []byte
}

// makeFuzz makes the n fuzzed messages of kinds in turn, due at dl.
func makeFuzz(rng *rand.Rand, n int, dl int64) ([]fuzzMsg, error) {
	out := make([]fuzzMsg, n)
	for i := range out {
		k := &fuzzKinds[i%len(fuzzKinds)]
		b := k.make(rng, i, dl)
		id := requestID(b)
		if k.dead != (id == "") {
			return nil, fmt.Errorf("fuzz kind %s: message %d has id %q, but the kind says dead=%v", k.name, i, id, k.dead)
		}
		out[i] = fuzzMsg{kind: k, id: id, body: b}
	}
	return out, nil
}

// expectFuzz puts one ledger entry per readable id of msgs, of its kind
// and with its one allowed code (a pair of messages sharing an id expects
// two results).
func expectFuzz(l *ledger, msgs []fuzzMsg) {
	for _, m := range msgs {
		if !m.kind.dead {
			l.expectAs(m.id, m.kind.name, []string{m.kind.code}, time.Time{})
		}
	}
}

// fuzzAccount is what accountFuzz found, in total and per kind.
type fuzzAccount struct {
	readable, deadExpected int
	deadLettered           int // dead letters read
	deadMissing            int // messages meant for the dead letters with none
	deadUnexpected         int // dead letters that are no such message, or a second copy of one
	perKind                map[string]*kindAccount
}

// kindAccount is one kind's share: messages sent, and what went wrong.
type kindAccount struct {
	sent, lost, duplicated, wrongCode, deadMissing, deadUnexpected int
}

// accountFuzz checks every fuzzed message per kind: the readable ones
// against the ledger's tally t (lost, duplicated, wrong code, by the kind
// each id was sent as), the others against the dead letters read (each
// must be there exactly once, byte for byte; a dead letter that is no such
// message — a message with a readable id, a good request, bytes changed —
// is unexpected).
func accountFuzz(msgs []fuzzMsg, l *ledger, t tally, dead [][]byte) fuzzAccount {
	a := fuzzAccount{deadLettered: len(dead), perKind: map[string]*kindAccount{}}
	want := map[string]*fuzzMsg{} // body → the dead-kind message
	for i := range msgs {
		m := &msgs[i]
		ka := a.perKind[m.kind.name]
		if ka == nil {
			ka = &kindAccount{}
			a.perKind[m.kind.name] = ka
		}
		ka.sent++
		if m.kind.dead {
			a.deadExpected++
			want[string(m.body)] = m
		} else {
			a.readable++
		}
	}
	kindOf := func(id string) *kindAccount {
		l.mu.Lock()
		defer l.mu.Unlock()
		if e := l.sent[id]; e != nil && e.kind != "" {
			return a.perKind[e.kind]
		}
		return nil
	}
	for _, id := range t.lostIDs {
		if ka := kindOf(id); ka != nil {
			ka.lost++
		}
	}
	for _, id := range t.dupIDs {
		if ka := kindOf(id); ka != nil {
			ka.duplicated++
		}
	}
	for _, w := range t.wrongIDs {
		if ka := kindOf(w[:strings.LastIndexByte(w, '=')]); ka != nil {
			ka.wrongCode++
		}
	}
	got := map[string]int{}
	for _, b := range dead {
		m, ok := want[string(b)]
		if got[string(b)]++; !ok || got[string(b)] > 1 {
			a.deadUnexpected++
			if ok {
				a.perKind[m.kind.name].deadUnexpected++
			}
		}
	}
	for body, m := range want {
		if got[body] == 0 {
			a.deadMissing++
			a.perKind[m.kind.name].deadMissing++
		}
	}
	return a
}

// apply puts the account's figures on v and fails it, per kind, for every
// message not accounted for (the ledger's own figures are judged by
// verdict.judge).
func (a fuzzAccount) apply(v *verdict) {
	v.extra["fuzz_readable"] = float64(a.readable)
	v.extra["fuzz_dead_expected"] = float64(a.deadExpected)
	v.extra["dead_lettered"] = float64(a.deadLettered)
	v.extra["dead_missing"] = float64(a.deadMissing)
	v.extra["dead_unexpected"] = float64(a.deadUnexpected)
	kinds := make([]string, 0, len(a.perKind))
	for k := range a.perKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		ka := a.perKind[k]
		if ka.lost+ka.duplicated+ka.wrongCode+ka.deadMissing+ka.deadUnexpected > 0 {
			v.fail("fuzz kind %s: %d sent, %d lost, %d duplicated, %d with a wrong code, %d not dead-lettered, %d dead-lettered again or unexpectedly",
				k, ka.sent, ka.lost, ka.duplicated, ka.wrongCode, ka.deadMissing, ka.deadUnexpected)
		}
	}
	if a.deadUnexpected > 0 {
		v.fail("%d dead letters are no fuzzed message meant for them, or a second copy of one", a.deadUnexpected)
	}
}

// fuzzFault: 10,000 fuzzed messages of the kinds above, mixed with 2,000
// good ones, into one replica. The replica must stay up; every good
// request gets exactly one 200 answer; every fuzzed message with a
// readable id exactly its results, with its kind's code; every other one
// exactly one dead letter, its bytes unchanged (accountFuzz).
func fuzzFault(tc transportCase) func(ctx context.Context, e *env) *verdict {
	return func(ctx context.Context, e *env) *verdict {
		s, v := open(ctx, e, "fuzz-"+tc.name, tc, brokerTweak{}, gatewayFaults{})
		if s == nil {
			return v
		}
		defer s.close()
		dlr, ok := s.b.(deadLetterReader)
		if !ok {
			v.fail("%s: its dead letters cannot be read back", tc.name)
			return v
		}
		cfgPath, err := s.r.writeConfig(baseConfig(s.b, s.gw.URL, 64))
		if err != nil {
			v.fail("config: %v", err)
			return v
		}
		p, err := s.r.startReady(ctx, cfgPath)
		if err != nil {
			v.fail("%v", err)
			return v
		}
		good := s.goodMessages("g", fuzzGood, 10*time.Minute)
		rng := rand.New(rand.NewPCG(42, uint64(len(tc.name))))
		dl := time.Now().Add(10 * time.Minute).Unix()
		fz, err := makeFuzz(rng, fuzzMessages, dl)
		if err != nil {
			v.fail("%v", err)
			return v
		}
		expectFuzz(s.l, fz)
		// The gateway names a call by its X-Chaos-Id header, which fuzzed
		// messages lose or garble, so their calls cannot be told apart by
		// id: the history keeps its other rules (a result needs an enqueue;
		// no more results than enqueues), not the one that a gateway's
		// answer needs a recorded call.
		s.l.mu.Lock()
		s.l.callsUnseen = true
		s.l.mu.Unlock()
		msgs := make([]outMsg, 0, fuzzMessages+fuzzGood)
		bytes, deadExpected := 0, 0
		for i, m := range fz {
			bytes += len(m.body)
			if m.kind.dead {
				deadExpected++
			}
			msgs = append(msgs, outMsg{body: m.body})
			if i%5 == 0 {
				msgs = append(msgs, good[i/5])
			}
		}
		start := time.Now()
		for i := 0; i < len(msgs); i += 1000 {
			if err := s.send(ctx, msgs[i:min(i+1000, len(msgs))]); err != nil {
				v.fail("send: %v", err)
				return v
			}
		}
		sent := time.Since(start)
		// Done when every readable id has its results and there are as
		// many dead letters as unreadable messages (or 3 minutes passed).
		limit := time.Now().Add(3 * time.Minute)
		for ctx.Err() == nil {
			sleep(ctx, 500*time.Millisecond)
			dead, err := s.b.deadLetters(ctx)
			if err != nil {
				v.fail("dead letters: %v", err)
				break
			}
			if (s.l.complete() && dead >= deadExpected) || time.Now().After(limit) || !p.alive() {
				break
			}
		}
		s.quiet(ctx, 2*time.Second, 4*time.Second)
		dead, err := dlr.deadLetterBodies(ctx)
		if err != nil {
			v.fail("dead letters: %v", err)
		}
		if !p.alive() {
			v.fail("the replica died: %s (log %s)", p.exitStatus(), p.logPath)
		} else if _, err := p.term(30 * time.Second); err != nil {
			v.fail("%v", err)
		}
		v.t = s.l.tally()
		v.judge(0)
		accountFuzz(fz, s.l, v.t, dead).apply(v)
		v.extra["fuzzed"] = fuzzMessages
		v.extra["fuzzed_mb"] = float64(bytes) / (1 << 20)
		v.extra["send_seconds"] = sent.Seconds()
		s.l.codeFigures(v.extra)
		return v
	}
}
