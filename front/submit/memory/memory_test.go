package memory_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/submit"
	"github.com/sluice-io/sluice/front/submit/memory"
	"github.com/sluice-io/sluice/front/submit/submittest"
	memtransport "github.com/sluice-io/sluice/transports/memory"
)

func TestConformance(t *testing.T) {
	submittest.Run(t, submittest.Harness{
		Features:      submittest.Features{RemovesQueued: true, CountsCancelled: true},
		TransportName: memtransport.Name,
		New: func(_ testing.TB, lease time.Duration) (transport.Transport, submit.Producer) {
			tr := memtransport.New(memtransport.Options{})
			return tr, memory.New(tr, memory.Options{Lease: lease})
		},
	})
}
