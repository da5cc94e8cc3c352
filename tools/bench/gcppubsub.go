package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/gcppubsub"
)

// The gcp-pubsub scenario's shape: a backlog of gcpRequests on the
// emulator, drained by a deployment with gcpConcurrency in flight (the
// default max_concurrency); the baseline pulls with gcpBaselineStreams
// streaming pulls.
const (
	gcpRequests        = 5_000
	gcpConcurrency     = 64
	gcpBaselineStreams = 8
	gcpProject         = "sluice-bench"
)

// runGCPPubSub: a backlog of 5k requests on the emulator's request topic,
// drained by sluice at its defaults (concurrency 64, 0-ms simulated
// gateway, results published to a result topic and counted on a
// subscription of it); throughput is results per second from sluice being
// ready to the last result. The baseline drains the same backlog, on the
// same emulator, with a bare pubsub/v2 client (gcpBaselineStreams streaming
// pulls, 64 messages outstanding): each message's request POSTed to the same
// kind of gateway, a result published and confirmed, the message acked.
// Each run measures both (alternating which goes first); ratio is the
// median of throughput / baseline.
func runGCPPubSub(ctx context.Context, o options) (figures, error) {
	emu, err := testenv.StartPubSubEmulatorProcess()
	if err != nil {
		return nil, err
	}
	defer emu.Stop()
	c, err := pubsub.NewClient(ctx, gcpProject, option.WithEndpoint(emu.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var rates, bases, ratios []float64
	for run := range o.runs {
		sluiceFirst := run%2 == 0
		var rate, base float64
		for i := range 2 {
			var err error
			if (i == 0) == sluiceFirst {
				rate, err = gcpSluiceRun(ctx, c, emu.Addr, "s"+strconv.Itoa(run))
			} else {
				base, err = gcpBaselineRun(ctx, c, "b"+strconv.Itoa(run))
			}
			if err != nil {
				return nil, err
			}
		}
		rates, bases, ratios = append(rates, rate), append(bases, base), append(ratios, rate/base)
	}
	return figures{"requests": gcpRequests, "throughput": median(rates), "baseline": median(bases),
		"ratio": median(ratios), "throughput_min": slices.Min(rates), "throughput_max": slices.Max(rates)}, nil
}

// gcpTopics creates the request and result topics and subscriptions of one
// run (names suffixed with id), publishes the backlog, and starts counting
// results. It returns the full names and the count.
type gcpRun struct {
	requestsSub, resultsTopic string
	got                       atomic.Int64
	stop                      func()
}

func gcpName(kind, id string) string { return "projects/" + gcpProject + "/" + kind + "/" + id }

func startGCPRun(ctx context.Context, c *pubsub.Client, id string) (*gcpRun, error) {
	for _, t := range []string{"requests-" + id, "results-" + id} {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: gcpName("topics", t)}); err != nil {
			return nil, err
		}
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
			Name: gcpName("subscriptions", t+"-sub"), Topic: gcpName("topics", t), AckDeadlineSeconds: 60}); err != nil {
			return nil, err
		}
	}
	dl := time.Now().Add(time.Hour)
	p := c.Publisher(gcpName("topics", "requests-"+id))
	res := make([]*pubsub.PublishResult, gcpRequests)
	for i := range gcpRequests {
		res[i] = p.Publish(ctx, &pubsub.Message{Data: benchPayload(i, dl)})
	}
	for _, r := range res {
		if _, err := r.Get(ctx); err != nil {
			p.Stop()
			return nil, err
		}
	}
	p.Stop()
	r := &gcpRun{requestsSub: "requests-" + id + "-sub", resultsTopic: "results-" + id}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Subscriber(gcpName("subscriptions", "results-"+id+"-sub")).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			r.got.Add(1)
		})
	}()
	r.stop = func() { cancel(); <-done }
	return r, nil
}

// wait waits until every result arrived and returns the time it took since start.
func (r *gcpRun) wait(ctx context.Context, start time.Time) (time.Duration, error) {
	limit := time.After(5 * time.Minute)
	for r.got.Load() < gcpRequests {
		select {
		case <-limit:
			return 0, fmt.Errorf("only %d of %d results after 5m", r.got.Load(), gcpRequests)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return time.Since(start), nil
}

// gcpSluiceRun drains a backlog with sluice at its defaults.
func gcpSluiceRun(ctx context.Context, c *pubsub.Client, emulator, id string) (float64, error) {
	r, err := startGCPRun(ctx, c, id)
	if err != nil {
		return 0, err
	}
	defer r.stop()
	opts, _ := json.Marshal(gcppubsub.Options{ProjectID: gcpProject, EmulatorHost: emulator})
	tr := transportRun{transport: gcppubsub.Name, options: string(opts), queue: r.requestsSub, results: r.resultsTopic, n: gcpRequests,
		produce: func(context.Context) error { return nil }, // the backlog is there
		done:    func(context.Context) (int64, error) { return r.got.Load(), nil },
	}
	return tr.measure(ctx)
}

// gcpBaselineRun drains a backlog with a bare pubsub/v2 client.
func gcpBaselineRun(ctx context.Context, c *pubsub.Client, id string) (float64, error) {
	r, err := startGCPRun(ctx, c, id)
	if err != nil {
		return 0, err
	}
	defer r.stop()
	sim, err := simulator.New(simulator.Config{Capacity: gcpConcurrency})
	if err != nil {
		return 0, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer sim.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: gcpConcurrency, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	url := gw + simulator.PathCompletions
	pub := c.Publisher(gcpName("topics", r.resultsTopic))
	defer pub.Stop()
	sub := c.Subscriber(gcpName("subscriptions", r.requestsSub))
	sub.ReceiveSettings.NumGoroutines = gcpBaselineStreams
	sub.ReceiveSettings.MaxOutstandingMessages = gcpConcurrency

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	var firstErr error
	fail := func(err error) { once.Do(func() { firstErr = err; cancel() }) }
	start := time.Now()
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- sub.Receive(rctx, func(ctx context.Context, m *pubsub.Message) {
			var req struct {
				ID      string          `json:"id"`
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(m.Data, &req); err != nil {
				fail(err)
				return
			}
			resp, err := hc.Post(url, "application/json", bytes.NewReader(req.Payload))
			if err != nil {
				fail(err)
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				fail(err)
				return
			}
			out, _ := json.Marshal(struct {
				ID         string          `json:"id"`
				StatusCode int             `json:"status_code"`
				Body       json.RawMessage `json:"body"`
			}{req.ID, resp.StatusCode, body})
			if _, err := pub.Publish(ctx, &pubsub.Message{Data: out}).Get(ctx); err != nil {
				fail(err)
				return
			}
			m.Ack()
		})
	}()
	el, err := r.wait(rctx, start)
	cancel()
	<-recvDone
	if firstErr != nil {
		return 0, fmt.Errorf("baseline: %w", firstErr)
	}
	if err != nil {
		return 0, err
	}
	return gcpRequests / el.Seconds(), nil
}
