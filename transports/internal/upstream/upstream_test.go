package upstream

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
)

func TestCancelled(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := mr.Set(CancelKey("r1"), "tok-1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  wire.Request
		want bool
	}{
		{wire.Request{ID: "r1", Token: "tok-1"}, true},
		{wire.Request{ID: "r1", Token: "other"}, false}, // an older enqueue of the same id
		{wire.Request{ID: "r1"}, false},                 // flat form: no token, no lookup
		{wire.Request{ID: "r2", Token: "tok-2"}, false},
	} {
		got, err := Cancelled(ctx, c, &tc.req)
		if err != nil || got != tc.want {
			t.Errorf("%+v: %v %v, want %v", tc.req, got, err, tc.want)
		}
	}
	mr.Close()
	if _, err := Cancelled(ctx, c, &wire.Request{ID: "r1", Token: "tok-1"}); err == nil {
		t.Error("no error with Redis down")
	}
}
