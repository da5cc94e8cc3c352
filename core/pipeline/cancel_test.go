package pipeline

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

func TestInflightCancelByJobAndID(t *testing.T) {
	f := newInflightIndex()
	type entry struct {
		ctx  context.Context
		done func()
	}
	reg := func(id, job string) entry {
		ctx, cancel := context.WithCancelCause(context.Background())
		return entry{ctx, f.Register(transport.Queue{Name: "q"}, &wire.Request{ID: id, Metadata: map[string]string{"job_id": job}}, cancel)}
	}
	a1, a2, b1 := reg("a1", "A"), reg("a2", "A"), reg("b1", "B")
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 2 {
		t.Fatalf("cancelled %d, want 2", n)
	}
	for _, e := range []entry{a1, a2} {
		if !errors.Is(context.Cause(e.ctx), errCancelled) {
			t.Errorf("cause %v, want ErrCancelled", context.Cause(e.ctx))
		}
	}
	if b1.ctx.Err() != nil {
		t.Error("job B cancelled with job A")
	}
	a1.done()
	a2.done()
	if n := f.Cancel(transport.Cancellation{RequestID: "b1"}); n != 1 || b1.ctx.Err() == nil {
		t.Errorf("cancel by id: %d", n)
	}
	b1.done()
	if f.Len() != 0 {
		t.Errorf("%d entries left", f.Len())
	}
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 0 {
		t.Errorf("cancelled %d finished requests", n)
	}
}
