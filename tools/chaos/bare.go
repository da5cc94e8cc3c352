package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The control of kill9-gcp-pubsub: the same kills, the same emulator and
// load, with a bare cloud.google.com/go/pubsub/v2 subscriber in place of
// sluice (this program, started with bareSubscriberEnv set): it receives a
// request, waits 50–250 ms (the gateway's latency), publishes a result and
// acks. What it cannot recover is the emulator's doing, not sluice's.
const (
	bareSubscriberEnv = "SLUICE_CHAOS_BARE_SUBSCRIBER"
	bareSpecPrefix    = "bare:"
)

// bareSpec is the child's spec: emulator|subscription id|result topic id|max outstanding.
func bareSpec(p *pubSub, maxOut int) string {
	return bareSpecPrefix + strings.Join([]string{p.subscriberAddr(), p.prefix + "-requests-sub", p.prefix + "-results", strconv.Itoa(maxOut)}, "|")
}

func runBareSubscriber(spec string) error {
	f := strings.Split(spec, "|")
	if len(f) != 4 {
		return fmt.Errorf("bad spec %q", spec)
	}
	maxOut, _ := strconv.Atoi(f[3])
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, pubSubProject, option.WithEndpoint(f[0]), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return err
	}
	pub := c.Publisher("projects/" + pubSubProject + "/topics/" + f[2])
	sub := c.Subscriber("projects/" + pubSubProject + "/subscriptions/" + f[1])
	sub.ReceiveSettings.MaxOutstandingMessages = maxOut
	sub.ReceiveSettings.MaxExtension = time.Minute
	sub.ReceiveSettings.NumGoroutines = 1
	return sub.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		var r struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(m.Data, &r)
		time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
		res, _ := json.Marshal(map[string]any{"id": r.ID, "status_code": 200, "payload": "{}"})
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: res}).Get(ctx); err != nil {
			m.Nack()
			return
		}
		m.Ack()
	})
}

// bareMain runs the bare subscriber when this process is one.
func bareMain() bool {
	spec := os.Getenv(bareSubscriberEnv)
	if spec == "" {
		return false
	}
	if err := runBareSubscriber(spec); err != nil {
		fmt.Fprintln(os.Stderr, "bare subscriber:", err)
		os.Exit(1)
	}
	return true
}
