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

	"github.com/sluice-io/sluice/core/wire"
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

// gcpPubSubTargets: the bound of every transport against its bare client.
func gcpPubSubTargets() []target {
	return []target{
		minimum("ratio", 0.70, "sluice at its defaults against a bare pubsub/v2 client doing the same work"),
		noFailures("failed"),
		noFailures("baseline_failed"),
	}
}

// runGCPPubSub: a backlog of 5k requests on the emulator's request topic,
// drained by sluice at its defaults (concurrency 64, 0-ms simulated
// gateway, results published to a result topic and counted on a
// subscription of it); throughput is ok results per second from sluice
// being started to the last result (the baseline's clock starts at the
// same point: its subscriber being started). The baseline drains the same backlog, on the
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
	var sl, base samples
	err = alternate(ctx, o.runs,
		func(ctx context.Context, run int) error {
			s, err := gcpSluiceRun(ctx, c, emu.Addr, "s"+strconv.Itoa(run))
			sl = append(sl, s)
			return err
		},
		func(ctx context.Context, run int) error {
			s, err := gcpBaselineRun(ctx, c, "b"+strconv.Itoa(run))
			base = append(base, s)
			return err
		})
	if err != nil {
		return nil, err
	}
	f := pairFigures("gcp-pubsub", sl, base)
	f["requests"], f["throughput_min"], f["throughput_max"] = gcpRequests, slices.Min(sl.rates()), slices.Max(sl.rates())
	return f, nil
}

// gcpTopics creates the request and result topics and subscriptions of one
// run (names suffixed with id), publishes the backlog, and starts counting
// results. It returns the full names and the count.
type gcpRun struct {
	requestsSub, resultsTopic string
	got                       atomic.Int64
	mu                        sync.Mutex
	results                   resultTally
	stop                      func()
}

// sample is the run's results counted, over seconds.
func (r *gcpRun) sample(seconds float64) sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sample{ok: r.results.ok, failed: r.results.failed + max(0, gcpRequests-r.results.total()), seconds: seconds}
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
			r.mu.Lock()
			r.results.add(m.Data)
			r.mu.Unlock()
			r.got.Add(1)
		})
	}()
	r.stop = func() { cancel(); <-done }
	return r, nil
}

// wait waits until every result arrived and returns the time it took since
// start, and the time to the first result (polled as transportRun polls).
func (r *gcpRun) wait(ctx context.Context, start time.Time) (all, first time.Duration, err error) {
	limit := time.After(5 * time.Minute)
	for r.got.Load() < gcpRequests {
		if first == 0 && r.got.Load() > 0 {
			first = time.Since(start)
		}
		select {
		case <-limit:
			return 0, 0, fmt.Errorf("only %d of %d results after 5m", r.got.Load(), gcpRequests)
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if first == 0 {
		first = time.Since(start)
	}
	return time.Since(start), first, nil
}

// gcpSluiceRun drains a backlog with sluice at its defaults.
func gcpSluiceRun(ctx context.Context, c *pubsub.Client, emulator, id string) (sample, error) {
	r, err := startGCPRun(ctx, c, id)
	if err != nil {
		return sample{}, err
	}
	defer r.stop()
	opts, _ := json.Marshal(gcppubsub.Options{ProjectID: gcpProject, EmulatorHost: emulator})
	// No produce: the backlog is there, the clock starts with sluice.
	tr := transportRun{transport: gcppubsub.Name, options: string(opts), queue: r.requestsSub, results: r.resultsTopic, n: gcpRequests,
		done: func(context.Context) (int64, error) { return r.got.Load(), nil },
	}
	s, err := tr.run(ctx)
	if err != nil {
		return sample{}, err
	}
	out := r.sample(s.seconds)
	out.first = s.first
	return out, nil
}

// gcpBaselineRun drains a backlog with a bare pubsub/v2 client.
// A call that fails is published as an error result, as sluice publishes
// one, so that both sides' failures are counted from their results.
func gcpBaselineRun(ctx context.Context, c *pubsub.Client, id string) (sample, error) {
	r, err := startGCPRun(ctx, c, id)
	if err != nil {
		return sample{}, err
	}
	defer r.stop()
	sim, err := simulator.New(simulator.Config{Capacity: gcpConcurrency})
	if err != nil {
		return sample{}, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return sample{}, err
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
			var out []byte
			if err := json.Unmarshal(m.Data, &req); err != nil {
				out = wire.ErrorResult(&wire.Request{ID: m.ID}, wire.CodeInvalidRequest, err.Error()).Marshal()
			} else {
				out = gcpBaselineCall(hc, url, req.ID, req.Payload)
			}
			if _, err := pub.Publish(ctx, &pubsub.Message{Data: out}).Get(ctx); err != nil {
				fail(err)
				return
			}
			m.Ack()
		})
	}()
	el, first, err := r.wait(rctx, start)
	cancel()
	<-recvDone
	if firstErr != nil {
		return sample{}, fmt.Errorf("baseline: %w", firstErr)
	}
	if err != nil {
		return sample{}, err
	}
	out := r.sample(el.Seconds())
	out.first = first
	return out, nil
}

// gcpBaselineCall POSTs one payload and returns its result: the answer, or
// an error result when the call got none.
func gcpBaselineCall(hc *http.Client, url, id string, payload []byte) []byte {
	req := &wire.Request{ID: id}
	resp, err := hc.Post(url, "application/json", bytes.NewReader(payload))
	if err != nil {
		return wire.ErrorResult(req, wire.CodeInferenceError, err.Error()).Marshal()
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return wire.ErrorResult(req, wire.CodeInferenceError, err.Error()).Marshal()
	}
	return (&wire.Result{ID: id, StatusCode: resp.StatusCode, Payload: string(body)}).Marshal()
}
