package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// A fault run's history, checked for linearizability against a
// queue-with-results model (porcupine), beside the ledger's counts.
//
// What the harness sees of one request id, each an operation with the
// interval in which it took effect:
//
//   - enqueue: from just before the message was built to when the send
//     that carried it returned (or the end of the run, when no send
//     reported back);
//   - dispatch: one gateway call for the id, from the call's start to its
//     end (the recording gateway's attempts);
//   - result: one result read from the result destination, with its
//     code, from the id's first enqueue to when it was read (the write took
//     effect somewhere in there; the reader polls).
//
// Claims and acks happen inside sluice and its broker, where the harness
// does not see them; on Redis the ack is the result write itself (one
// fenced script), so the result operation stands for both.
//
// The model, per id (the history is partitioned by id): a result needs an
// enqueue before it; a result that carries the gateway's answer ("ok", or
// "http_<status>") needs a dispatch of the id that started before it; and,
// exactly once, the results of an id never outnumber its enqueues at any
// point. For a fault whose transport may repeat a result on a crash
// (judge's dupAllowed > 0) the last rule is dropped: at least once; for a
// run whose results do not come from the recording gateway (the bare
// control) the dispatch rule is. A
// history with none of this broken is linearizable; one with a result for
// an id never sent, a second result, or an answer before any call is not.

// histKind is an operation of the model.
type histKind uint8

const (
	histEnqueue histKind = iota
	histDispatch
	histResult
)

// histOp is one operation of an id's history.
type histOp struct {
	kind histKind
	id   string
	code string // a result's code
	call time.Time
	ret  time.Time // zero: still open at the end of the run
}

// queueState is the model's state for one id.
type queueState struct {
	enqueued, dispatched, results int
}

// gatewayCode reports whether a result of code carries the gateway's answer
// (so a call of its id must have started before it).
func gatewayCode(code string) bool {
	return code == "ok" || strings.HasPrefix(code, "http_")
}

// historyRules say which of the model's rules are dropped.
type historyRules struct {
	atLeastOnce bool // a result may repeat (no one-result-per-enqueue rule)
	callsUnseen bool // the gateway's calls are not recorded (no dispatch rule)
}

// queueModel is the queue-with-results model under r.
func queueModel(r historyRules) porcupine.Model {
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var ids []string
			for _, op := range h {
				id := op.Input.(histOp).id
				if _, ok := by[id]; !ok {
					ids = append(ids, id)
				}
				by[id] = append(by[id], op)
			}
			out := make([][]porcupine.Operation, 0, len(ids))
			for _, id := range ids {
				out = append(out, by[id])
			}
			return out
		},
		Init: func() any { return queueState{} },
		Step: func(state, input, _ any) (bool, any) {
			s, op := state.(queueState), input.(histOp)
			switch op.kind {
			case histEnqueue:
				s.enqueued++
			case histDispatch:
				if s.enqueued == 0 {
					return false, s
				}
				s.dispatched++
			case histResult:
				if s.enqueued == 0 || (!r.atLeastOnce && s.results >= s.enqueued) ||
					(!r.callsUnseen && gatewayCode(op.code) && s.dispatched == 0) {
					return false, s
				}
				s.results++
			}
			return true, s
		},
		DescribeOperation: func(input, _ any) string {
			op := input.(histOp)
			return fmt.Sprintf("%s %s %s", [...]string{"enqueue", "dispatch", "result"}[op.kind], op.id, op.code)
		},
	}
}

// linearity is the verdict of the history check.
type linearity struct {
	ok     bool
	ops    int
	badIDs []string // the ids whose history is not linearizable (sorted)
	result porcupine.CheckResult
}

// checkHistory checks ops against the model. Each id is checked on its
// own (the model's partition), so that the ids that break it can be named.
func checkHistory(ops []histOp, r historyRules, timeout time.Duration) linearity {
	if len(ops) == 0 {
		return linearity{ok: true, result: porcupine.Ok}
	}
	base := ops[0].call
	end := ops[0].call
	for _, op := range ops {
		if op.call.Before(base) {
			base = op.call
		}
		if op.ret.After(end) {
			end = op.ret
		}
		if op.call.After(end) {
			end = op.call
		}
	}
	stamp := func(t time.Time) int64 { return int64(t.Sub(base)) }
	open := stamp(end) + int64(time.Hour) // still open at the end: after everything
	hist := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		ret := open
		if !op.ret.IsZero() {
			ret = max(stamp(op.ret), stamp(op.call))
		}
		hist[i] = porcupine.Operation{ClientId: i, Input: op, Call: stamp(op.call), Return: ret}
	}
	m := queueModel(r)
	lin := linearity{ok: true, ops: len(ops), result: porcupine.Ok}
	for _, part := range m.Partition(hist) {
		single := m
		single.Partition = nil
		switch porcupine.CheckOperationsTimeout(single, part, timeout) {
		case porcupine.Illegal:
			lin.ok = false
			lin.result = porcupine.Illegal
			lin.badIDs = append(lin.badIDs, part[0].Input.(histOp).id)
		case porcupine.Unknown:
			if lin.result == porcupine.Ok {
				lin.result = porcupine.Unknown
			}
		}
	}
	if lin.result == porcupine.Unknown && lin.ok {
		// Not proven either way within the time: not shown as linearizable.
		lin.ok = false
	}
	sort.Strings(lin.badIDs)
	return lin
}

// historyTimeout bounds the check of one id's history (a few operations
// each: far more than enough).
const historyTimeout = 10 * time.Second
