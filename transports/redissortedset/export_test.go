package redissortedset

import (
	"time"

	"github.com/sluice-io/sluice/core/transport"
)

// SetIdleWait sets the next idle wait of a source made by Transport.Source,
// as if its claim loop had found the queue empty for a long time.
func SetIdleWait(src transport.Source, d time.Duration) { src.(*source).idle = d }

// Fault points of the cross-slot settle (see xslot.go).
const (
	FaultBeforePrepare    = faultBeforePrepare
	FaultBeforePush       = faultBeforePush
	FaultBeforeCommit     = faultBeforeCommit
	FaultBeforePayloadDel = faultBeforePayloadDel
)

// SetFaultHook sets the hook called before each step of tp's cross-slot
// settles; an error it returns fails that step.
func SetFaultHook(tp *Transport, fn func(point int) error) { tp.faultHook = fn }
