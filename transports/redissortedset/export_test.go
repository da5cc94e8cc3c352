package redissortedset

import (
	"time"

	"github.com/sluice-io/sluice/core/transport"
)

// SetIdleWait sets the next idle wait of a source made by Transport.Source,
// as if its claim loop had found the queue empty for a long time.
func SetIdleWait(src transport.Source, d time.Duration) { src.(*source).idle = d }
