package memory_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/submit/submittest"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/internal/rigs/dispatcher"
	"github.com/sluice-io/sluice/transports/memory"
)

func TestProducerConformance(t *testing.T) {
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	submittest.Run(t, submittest.Harness{
		Features:      submittest.Features{RemovesQueued: true, CountsCancelled: true},
		TransportName: memory.Name,
		Dispatch:      dispatcher.Runner(ad),
		New: func(_ testing.TB, lease time.Duration) (transport.Transport, submit.Producer) {
			tr := memory.New(memory.Options{})
			return tr, memory.NewProducer(tr, submit.ReaderOptions{Lease: lease})
		},
	})
}

// OpenProducer builds the transport the dispatcher must run on and a
// producer whose requests land on it; it refuses unknown options as the
// transport does.
func TestOpenProducer(t *testing.T) {
	p, tr, err := memory.OpenProducer(json.RawMessage(`{"batch_size": 8}`), transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	mem, ok := tr.(*memory.Transport)
	if !ok {
		t.Fatalf("OpenProducer returned transport %T, want the memory transport", tr)
	}
	req := &wire.Request{ID: "r1", Deadline: time.Now().Add(time.Minute), Payload: json.RawMessage(`{}`)}
	if err := p.Enqueue(context.Background(), "q", []*wire.Request{req}); err != nil {
		t.Fatal(err)
	}
	if d, err := mem.Depth(context.Background(), transport.Queue{Name: "q"}); err != nil || d.Waiting != 1 {
		t.Errorf("depth of q after an enqueue: %+v %v, want 1 waiting", d, err)
	}
	if _, _, err := memory.OpenProducer(json.RawMessage(`{"batch_sise": 8}`), transport.Env{}); err == nil || !strings.Contains(err.Error(), "batch_sise") {
		t.Errorf("unknown option: %v, want it refused", err)
	}
}
