package upstream

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	msg "github.com/sluice-io/sluice/core/message"
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
		req  msg.Request
		want bool
	}{
		{msg.Request{ID: "r1", Token: "tok-1"}, true},
		{msg.Request{ID: "r1", Token: "other"}, false}, // an older enqueue of the same id
		{msg.Request{ID: "r1"}, false},                 // flat form: no token, no lookup
		{msg.Request{ID: "r2", Token: "tok-2"}, false},
	} {
		got, err := Cancelled(ctx, c, &tc.req)
		if err != nil || got != tc.want {
			t.Errorf("%+v: %v %v, want %v", tc.req, got, err, tc.want)
		}
	}
	mr.Close()
	if _, err := Cancelled(ctx, c, &msg.Request{ID: "r1", Token: "tok-1"}); err == nil {
		t.Error("no error with Redis down")
	}
}
