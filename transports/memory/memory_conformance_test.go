package memory_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
	"github.com/sluice-io/sluice/transports/transporttest"
)

func TestConformance(t *testing.T) {
	var tp *memory.Transport
	var seq atomic.Int64
	transporttest.Run(t, transporttest.Harness{
		Features: transporttest.Features{
			Ordering:            transporttest.ByDeadline,
			AtLeastOnce:         true,
			DelayedRequeue:      true,
			RequeueKeepsPlace:   true,
			Results:             true,
			ConcurrentConsumers: true,
		},
		New: func(testing.TB) transport.Transport {
			tp = memory.New(memory.Options{})
			return tp
		},
		Queue: func(testing.TB) transport.Queue {
			n := seq.Add(1)
			return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("requests-", n), ResultName: fmt.Sprint("results-", n)}
		},
		Publish: func(t testing.TB, q transport.Queue, payload []byte) {
			if err := tp.Enqueue(q.Name, payload); err != nil {
				t.Fatal(err)
			}
		},
		Results: func(_ testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			deadline := time.After(timeout)
			for {
				got, more := tp.ResultCount(q.ResultName)
				if got >= n {
					return tp.Results(q.ResultName)
				}
				select {
				case <-more:
				case <-deadline:
					return tp.Results(q.ResultName)
				}
			}
		},
	})
}
