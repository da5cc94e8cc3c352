package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// fuzzMessages and fuzzGood size the fuzz case of each transport: 10,000
// fuzzed messages mixed with good ones.
const (
	fuzzMessages = 10_000
	fuzzGood     = 2_000
)

// fuzzKinds are the kinds of fuzzed message, drawn in turn; each makes
// message i (unique bytes: a sorted set would merge equal members).
var fuzzKinds = []struct {
	name string
	make func(rng *rand.Rand, i int, dl int64) []byte
}{
	{"oversized", func(_ *rand.Rand, i int, dl int64) []byte {
		// One in forty is 1 MiB of prompt; the others 16 KiB, so 10,000 stay affordable.
		n := 16 << 10
		if i%40 == 0 {
			n = 1 << 20
		}
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":{"model":"m","prompt":"%s"}}`, i, dl, strings.Repeat("x", n))
	}},
	{"deep-nesting", func(_ *rand.Rand, i int, dl int64) []byte {
		d := 12_000 // past encoding/json's limit of 10,000
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":%s1%s}`, i, dl, strings.Repeat("[", d), strings.Repeat("]", d))
	}},
	{"deep-metadata", func(_ *rand.Rand, i int, dl int64) []byte {
		d := 2_000
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":{},"metadata":%s"x"%s}`, i, dl, strings.Repeat(`{"a":`, d), strings.Repeat("}", d))
	}},
	{"invalid-utf8", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, "{\"id\":\"f-%d\",\"deadline\":%d,\"payload\":{\"model\":\"m\",\"prompt\":\"\xff\xfe\xc3\x28\"},\"metadata\":{\"k\":\"\xed\xa0\x80\"}}", i, dl)
	}},
	{"invalid-utf8-id", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, "{\"id\":\"f-%d-\xff\xfe\",\"deadline\":%d,\"payload\":{}}", i, dl)
	}},
	{"wrong-type-id", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":%d,"deadline":%d,"payload":{}}`, 1_000_000+i, dl)
	}},
	{"wrong-type-deadline", func(_ *rand.Rand, i int, _ int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":"tomorrow","payload":{}}`, i)
	}},
	{"wrong-type-metadata", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":{},"metadata":[1,2,3],"headers":"x"}`, i, dl)
	}},
	{"wrong-type-payload", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":%d,"payload":"not an object"}`, i, dl)
	}},
	{"duplicate-id", func(_ *rand.Rand, i int, dl int64) []byte {
		// Two messages per id (this one and the next of its kind share it).
		return fmt.Appendf(nil, `{"id":"f-dup-%d","deadline":%d,"payload":{"n":%d},"headers":{"X-Chaos-Id":"f-dup"}}`, i/(2*17), dl, i)
	}},
	{"missing-id", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"deadline":%d,"payload":{"n":%d}}`, dl, i)
	}},
	{"empty-id", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"id":"","deadline":%d,"payload":{"n":%d}}`, dl, i)
	}},
	{"garbage", func(rng *rand.Rand, i int, _ int64) []byte {
		b := make([]byte, 16+rng.IntN(512))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		return append(fmt.Appendf(nil, "%d:", i), b...)
	}},
	{"truncated", func(_ *rand.Rand, i int, dl int64) []byte {
		b := flatRequest(fmt.Sprintf("f-%d", i), time.Unix(dl, 0))
		return b[:len(b)/2]
	}},
	{"not-an-object", func(_ *rand.Rand, i int, _ int64) []byte {
		return fmt.Appendf(nil, `[%d,"id",null]`, i)
	}},
	{"envelope-wrong-kind", func(_ *rand.Rand, i int, dl int64) []byte {
		return fmt.Appendf(nil, `{"request_kind":"banana","internal":{"retry_count":"x"},"data":{"id":"f-%d","deadline":%d}}`, i, dl)
	}},
	{"past-deadline", func(_ *rand.Rand, i int, _ int64) []byte {
		return fmt.Appendf(nil, `{"id":"f-%d","deadline":1,"payload":{}}`, i)
	}},
}

// fuzzFault: 10,000 fuzzed messages of the kinds above, mixed with 2,000
// good ones, into one replica. The replica must stay up; every good
// request gets exactly one result; every fuzzed message ends as a result
// or a dead letter: silent = fuzzed - (results for them + dead letters)
// must be 0.
func fuzzFault(tc transportCase) func(ctx context.Context, e *env) *verdict {
	return func(ctx context.Context, e *env) *verdict {
		s, v := open(ctx, e, "fuzz-"+tc.name, tc, brokerTweak{}, gatewayFaults{})
		if s == nil {
			return v
		}
		defer s.close()
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
		msgs := make([]outMsg, 0, fuzzMessages+fuzzGood)
		bytes := 0
		for i := range fuzzMessages {
			k := fuzzKinds[i%len(fuzzKinds)]
			b := k.make(rng, i, dl)
			bytes += len(b)
			msgs = append(msgs, outMsg{body: b})
			if i%5 == 0 {
				msgs = append(msgs, good[i/5])
			}
		}
		start := time.Now()
		for i := 0; i < len(msgs); i += 1000 {
			if err := s.b.send(ctx, msgs[i:min(i+1000, len(msgs))]); err != nil {
				v.fail("send: %v", err)
				return v
			}
		}
		sent := time.Since(start)
		// Done when the good ones are all answered and results plus dead
		// letters account for every fuzzed message (or 3 minutes passed).
		var dead, fuzzResults int
		limit := time.Now().Add(3 * time.Minute)
		for ctx.Err() == nil {
			sleep(ctx, 500*time.Millisecond)
			dead, err = s.b.deadLetters(ctx)
			if err != nil {
				v.fail("dead letters: %v", err)
				break
			}
			s.l.mu.Lock()
			fuzzResults = s.l.unknown
			s.l.mu.Unlock()
			if (s.l.complete() && fuzzResults+dead >= fuzzMessages) || time.Now().After(limit) || !p.alive() {
				break
			}
		}
		s.quiet(ctx, 2*time.Second, 4*time.Second)
		if dead, err = s.b.deadLetters(ctx); err != nil {
			v.fail("dead letters: %v", err)
		}
		if !p.alive() {
			v.fail("the replica died: %s (log %s)", p.exitStatus(), p.logPath)
		} else if _, err := p.term(30 * time.Second); err != nil {
			v.fail("%v", err)
		}
		v.t = s.l.tally()
		fuzzResults = v.t.unknown // results for ids the ledger does not hold are the fuzzed ones
		v.t.unknown = 0
		silent := fuzzMessages - fuzzResults - dead
		v.judge(0)
		if silent != 0 {
			v.fail("fuzzed messages: %d sent, %d results, %d dead letters: %d unaccounted (negative: more results than messages)", fuzzMessages, fuzzResults, dead, silent)
		}
		v.extra["fuzzed"] = fuzzMessages
		v.extra["fuzzed_mb"] = float64(bytes) / (1 << 20)
		v.extra["fuzz_results"] = float64(fuzzResults)
		v.extra["dead_lettered"] = float64(dead)
		v.extra["silent"] = float64(silent)
		v.extra["send_seconds"] = sent.Seconds()
		s.l.codeFigures(v.extra)
		return v
	}
}
